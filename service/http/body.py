"""A request body read once: sent as JSON, nested at most MAX_JSON_DEPTH deep, every string
encodable text (`json_body`, every route that takes a body). Its model (its API's protocol.py) checks
the rest.

JSON only, by its Content-Type (`application/json`, any charset, or an `application/*+json`
type): anything else is a 415 before the body is read. A web page on another origin can make a
browser POST a form or `text/plain` without asking first (no CORS preflight), and reading such a
body as JSON would let any page a developer visits spend this service's CPU; `application/json`
from another origin needs a preflight, which this service never grants (it sends no CORS
headers). FastAPI, under vLLM's own server, refuses a JSON body sent as anything else likewise."""

from __future__ import annotations

from flask import Request
from werkzeug.exceptions import BadRequest

from service.errors import InvalidJson, InvalidRequest, InvalidText, UnsupportedMediaType

# What parses below Python's recursion limit can still be too deep for what reads it later (a
# schema's validator, the grammar compiler, recursive code): a body nests at most this much,
# room for a JSON schema some 45 properties deep inside `response_format`.
MAX_JSON_DEPTH = 100


def json_body(request: Request) -> dict:
    """The body as a JSON object, nested at most MAX_JSON_DEPTH deep and all its text encodable:
    every route that takes a body reads it here, so every field is checked once, before anything
    can reach a tokenizer, a grammar compiler or an engine."""
    if not request.is_json:  # werkzeug's rule: application/json or application/*+json, any parameters
        sent = request.mimetype or "no Content-Type"
        raise UnsupportedMediaType(f"the request body must be sent as 'Content-Type: application/json', not {sent}")
    too_deep = InvalidJson(f"request body is not valid JSON: nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        body = request.get_json()
    except BadRequest as exc:
        raise InvalidJson("request body is not valid JSON") from exc
    except RecursionError as exc:  # Python's parser recurses once per level: ~1,000 deep ends here
        raise too_deep from exc
    if _walk(body, MAX_JSON_DEPTH):
        raise too_deep
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    return body


def _walk(value, limit: int) -> bool:
    """Whether objects and arrays nest more than `limit` levels; raises InvalidText, naming the
    field, for a string (a value or a key) that is not Unicode text: JSON's \ud800 escapes parse
    to lone surrogates, which no tokenizer can encode. Iterative, so it cannot recurse."""
    stack = [(value, 1, "")]
    while stack:
        value, depth, where = stack.pop()
        if isinstance(value, str):
            _check_text(value, where)
        elif isinstance(value, (dict, list)):
            if depth > limit:
                return True
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, child in items:
                if isinstance(key, str):
                    _check_text(key, where, name=True)
                    key_path = f"{where}.{key}" if where else key
                else:
                    key_path = f"{where}[{key}]"
                stack.append((child, depth + 1, key_path))
    return False


def _check_text(text: str, where: str, *, name: bool = False) -> None:
    """`where`: the field's path (`messages[0].content`); `name`: `text` is a field name in it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        param = where.split(".")[0].split("[")[0] or None  # the top-level field, OpenAI's `param`
        what = f"the field name {ascii(text)}" + (f" in '{where}'" if where else "") if name else f"'{where}'"
        raise InvalidText(
            f"{what} is not valid Unicode text: {exc.reason} at character {exc.start}", param=param
        ) from None
