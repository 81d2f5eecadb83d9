"""A request body read once: JSON, nested at most MAX_JSON_DEPTH deep, every string encodable
text (`json_body`, every route that takes a body); the demo routes' bodies as their models
(service/protocol/demo.py) and the engines' prompts (`parse`)."""

from __future__ import annotations

from dataclasses import dataclass

from flask import Request, current_app, request
from werkzeug.exceptions import BadRequest

from batcher.sampling import SamplingParams
from batcher.sequence import Prompt
from service import context
from service import protocol as bodies
from service.config import Config
from service.errors import InvalidJson, InvalidRequest, InvalidText
from service.params import parse_sampling
from service.protocol import demo

# What parses below Python's recursion limit can still be too deep for what reads it later (a
# schema's validator, the grammar compiler, recursive code): a body nests at most this much,
# room for a JSON schema some 45 properties deep inside `response_format`.
MAX_JSON_DEPTH = 100


# Every field the demo routes read, besides their prompt(s): our own API, so a name outside it is
# a typo (400, with the nearest known name), where the OpenAI routes follow vLLM and ignore it.
DEMO_FIELDS = frozenset(bodies.names(demo.Generate)) - {"prompts"}


@dataclass(frozen=True)
class GenerateRequest:
    prompts: list[Prompt]  # as the engines run them (service/context.py)
    params: SamplingParams
    details: bool = False
    n: int = 1  # completions per prompt, each its own sequence
    body: demo.Generate | demo.Single | None = None  # the body as its model read it


def json_body(request: Request) -> dict:
    """The body as a JSON object, nested at most MAX_JSON_DEPTH deep and all its text encodable:
    every route that takes a body reads it here, so every field is checked once, before anything
    can reach a tokenizer, a grammar compiler or an engine."""
    too_deep = InvalidJson(f"request body is not valid JSON: nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        body = request.get_json(force=True)  # the body is JSON whatever the Content-Type says
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


def completion_prompts(prompt) -> list[Prompt]:
    """/completions' `prompt` (service/protocol/openai.py's `Completion` checked its shape: a
    string, strings, token ids or lists of them) as a list of prompts; token ids become tuples,
    whether they are in the vocabulary only the engine knows (EngineThread._check_token_ids)."""
    if isinstance(prompt, str):
        return [prompt]
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    return [tuple(ids) for ids in ([prompt] if all(isinstance(t, int) for t in prompt) else prompt)]


def parse(request: Request, config: Config, model: type[demo.Generate | demo.Single]) -> GenerateRequest:
    """The body as `model` (service/protocol/demo.py): unknown fields, types and ranges checked there."""
    body = json_body(request)
    fields = bodies.validate(model, body, config)
    key = "prompt" if isinstance(fields, demo.Single) else "prompts"
    prompts = [fields.prompt] if key == "prompt" else fields.prompts
    params = parse_sampling(body, config, default_temperature=0.0)
    prompts = context.fit(prompts, body, params.max_tokens, key)
    return GenerateRequest(prompts=prompts, params=params, details=bool(fields.details), n=fields.n or 1, body=fields)


def from_request(model: type[demo.Generate | demo.Single] = demo.Generate) -> GenerateRequest:
    """Parse the current Flask request with the app's settings."""
    return parse(request, current_app.config["SERVICE"], model)
