"""The bounds of a body that are settings, not constants (MAX_NEW_TOKENS_LIMIT, MAX_N, ...):
declared on the field as `AtMost("max_n")`, checked against the app's `Config` (the validation
context), and shown in /openapi.json as that setting's value (service/openapi.py)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler, ValidationInfo
from pydantic_core import PydanticCustomError, core_schema

from service.errors import TooManyPrompts

MARK = "x-at-most"  # the JSON schema keyword that names the setting, until the document fills it in


@dataclass(frozen=True)
class AtMost:
    """`setting`: the Config field that bounds the value (a list: its length). `too_many`: the
    413 `too_many_prompts` instead of a 400/422, for the prompt count (docs/api.md, Errors)."""

    setting: str
    too_many: bool = False

    def __get_pydantic_core_schema__(self, source, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.with_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(self, schema, handler: GetJsonSchemaHandler) -> dict:
        out = handler(schema)
        out[MARK] = self.setting
        return out

    def _check(self, value, info: ValidationInfo):
        config = (info.context or {}).get("config")
        if value is None or config is None:
            return value
        limit = getattr(config, self.setting)
        size = len(value) if isinstance(value, (list, tuple)) else value
        if size <= limit:
            return value
        if self.too_many:  # not a ValueError: pydantic lets it through as it is
            raise TooManyPrompts(f"{size} prompts; at most {limit} per request", param=info.field_name)
        raise PydanticCustomError(
            "at_most", "must be at most {limit} ({setting})", {"limit": limit, "setting": self.setting.upper()}
        )


def fill(schema, config) -> None:
    """Replace every MARK in a JSON schema (in place) by the setting's value: `maximum` for a
    number, `maxItems` for an array."""
    if isinstance(schema, list):
        for item in schema:
            fill(item, config)
    elif isinstance(schema, dict):
        setting = schema.pop(MARK, None)
        if setting is not None:
            limit = getattr(config, setting)
            schema["maxItems" if schema.get("type") == "array" else "maximum"] = limit
        for value in schema.values():
            fill(value, config)
