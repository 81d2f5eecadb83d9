"""How a setting's range and a bad value are worded: one line naming the setting, its range and
what it got, for the start-up check (service/config.py's `Config.from_env`) and the docs' Knobs
table. `config`: the Config class, whose fields declare their ranges (`between`)."""

from __future__ import annotations


def range_text(config, name: str) -> str:
    """A field's range as the start-up check and the docs' Knobs table word it: `1..256`,
    `> 0, <= 86400`; "" for a field with none."""
    bounds = {}
    for item in config.__pydantic_fields__[name].metadata:
        for key in ("ge", "gt", "le"):
            if getattr(item, key, None) is not None:
                bounds[key] = getattr(item, key)
    text = {key: f"{value:g}" if isinstance(value, float) else str(value) for key, value in bounds.items()}
    if "ge" in text and "le" in text:
        return f"{text['ge']}..{text['le']}"
    words = {"ge": ">=", "gt": ">", "le": "<="}
    return ", ".join(f"{words[key]} {value}" for key, value in text.items())


def worded(config, error: dict) -> str:
    """One pydantic error as one line: `REQUEST_TIMEOUT_S must be a finite number in > 0, <= 86400, got 'nan'`."""
    if not error["loc"]:  # __post_init__'s own rules raise SettingError, already worded
        return str(error.get("ctx", {}).get("error", error["msg"]))
    name = str(error["loc"][0])
    kind = {"int": "a whole number", "float": "a finite number", "bool": "a flag (1/0, true/false, yes/no, on/off)"}
    field_type = str(config.__pydantic_fields__[name].annotation)
    what = next((words for key, words in kind.items() if key in field_type), "a string")
    span = range_text(config, name)
    span = f" in {span}" if ".." in span else f" ({span})" if span else ""
    return f"{name.upper()} must be {what}{span}, got {error['input']!r}"
