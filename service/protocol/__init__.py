"""What every API's request models share (each API's own are its folder's protocol.py, as in vLLM's
entrypoints/openai/*/protocol.py): `sampling` (the fields every generate body has), `limits`
(the bounds of a body), and `validate`. From the models come the 400s, /openapi.json
(service/ops/openapi.py) and the parameter tables of docs/ (checked by tests/unit/test_bodies.py).

`validate` turns pydantic's errors into the documented shapes: an unknown top-level field on a
demo route is `UnknownField` (400, every one named, with the nearest known name); any other
error `InvalidRequest` (422 on the demo routes, 400 on the OpenAI ones) naming the top-level
field in `param`; `max_queue_ms` the 400 that admission gives its header too.
"""

from __future__ import annotations

import difflib
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from service.config import Config
from service.errors import InvalidDeadline, InvalidRequest, UnknownField

Body = TypeVar("Body", bound=BaseModel)
TAGS = {"str", "int", "float", "bool", "dict", "list", "none", "literal"}  # union members in a loc


def names(model: type[BaseModel]) -> list[str]:
    """The field names a body of `model` takes, as JSON spells them (aliases)."""
    return [field.alias or name for name, field in model.model_fields.items()]


def validate(model: type[Body], body: dict, config: Config) -> Body:
    """`body` as `model`, or the first of its errors as an ApiError (module docstring)."""
    try:
        return model.model_validate(body, context={"config": config})
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
    unknown = [e["loc"][0] for e in errors if e["type"] == "extra_forbidden" and len(e["loc"]) == 1]
    if unknown:
        raise _unknown(unknown, names(model))
    field = errors[0]["loc"][0] if errors[0]["loc"] else None
    if field is None:
        raise InvalidRequest(errors[0]["msg"])
    own = [e for e in errors if e["loc"] and e["loc"][0] == field]  # a union's members: every way it failed
    path = _path(own[0]["loc"])
    why = " or ".join(dict.fromkeys(_lower(e["msg"]) for e in own))
    got = "" if own[0]["type"] == "missing" else f", got {_short(own[0]['input'])}"
    cls = InvalidDeadline if field == "max_queue_ms" else InvalidRequest  # as X-Max-Queue-Ms is refused
    message = f"'{path}' is required" if own[0]["type"] == "missing" else f"'{path}': {why}{got}"
    raise cls(message, param=str(field))


def _unknown(unknown: list[str], known: list[str]) -> UnknownField:
    described = []
    for name in unknown:
        near = difflib.get_close_matches(name, sorted(known), n=1)
        described.append(f"'{name}'" + (f" (did you mean '{near[0]}'?)" if near else ""))
    return UnknownField(
        f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(described)}; "
        f"this route takes {', '.join(sorted(known))}",
        param=unknown[0],
    )


def _path(loc: tuple) -> str:
    """`messages[0].role` from pydantic's loc, without the names it gives a union's members."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not (part in TAGS or "[" in part or "-" in part or part[:1].isupper()):
            out += f".{part}" if out else part
    return out


def _lower(message: str) -> str:
    return message[:1].lower() + message[1:]


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
