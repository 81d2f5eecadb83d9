"""The request body of every generate endpoint, parsed and validated in one place."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from flask import Request, current_app, request
from werkzeug.exceptions import BadRequest

from batcher.sampling import SamplingParams
from batcher.sequence import Prompt
from service import context
from service.config import Config
from service.errors import InvalidJson, InvalidRequest, InvalidText, TooManyPrompts, UnknownField
from service.params import parse_n, parse_sampling

# What parses below Python's recursion limit can still be too deep for what reads it later (a
# schema's validator, the grammar compiler, recursive code): a body nests at most this much,
# room for a JSON schema some 45 properties deep inside `response_format`.
MAX_JSON_DEPTH = 100


# Every field the demo routes read, besides their prompt(s): our own API, so a name outside it is
# a typo (400, with the nearest known name), where the OpenAI routes follow vLLM and ignore it.
DEMO_FIELDS = frozenset(
    """details n max_tokens temperature top_p top_k min_p stop stop_token_ids min_tokens seed logprobs
    presence_penalty frequency_penalty repetition_penalty logit_bias ignore_eos response_format
    structured_outputs max_queue_ms truncate_prompt_tokens""".split()
)


@dataclass(frozen=True)
class GenerateRequest:
    prompts: list[Prompt]  # as the engines run them (service/context.py)
    params: SamplingParams
    details: bool = False
    n: int = 1  # completions per prompt, each its own sequence


def flag(body: dict, key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequest(f"'{key}' must be true or false", param=key)
    return value


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


def _check_count(prompts: list, config: Config, key: str) -> None:
    if len(prompts) > config.max_prompts_per_request:
        raise TooManyPrompts(f"{len(prompts)} prompts; at most {config.max_prompts_per_request} per request", param=key)


def check_prompts(prompts: list, config: Config, key: str) -> list[str]:
    """Every prompt a non-empty string, at most MAX_PROMPTS_PER_REQUEST of them."""
    _check_count(prompts, config, key)
    for i, prompt in enumerate(prompts):
        where = f"'{key}[{i}]'" if len(prompts) > 1 or key == "prompts" else f"'{key}'"
        if not isinstance(prompt, str):
            raise InvalidRequest(f"{where} must be a string, got {type(prompt).__name__}", param=key)
        if not prompt.strip():
            raise InvalidRequest(f"{where} is empty", param=key)
    return prompts


def is_token_ids(value) -> bool:
    """A list of token ids (integers >= 0; JSON true is not the id 1); the vocabulary is the engine's."""
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)


def completion_prompts(value, config: Config) -> list[Prompt]:
    """/completions' `prompt`, in any of the shapes OpenAI and vLLM take: a string, a list of
    strings, a list of token ids, or a list of such lists. Token ids become tuples; whether they
    are in the vocabulary only the engine knows (EngineThread._check_token_ids)."""
    rule = "a string, a list of strings, a list of token ids, or a list of lists of token ids"
    if isinstance(value, str):
        return check_prompts([value], config, "prompt")
    if not isinstance(value, list) or not value:
        raise InvalidRequest(f"'prompt' must be {rule} (and not empty)", param="prompt")
    if all(isinstance(p, str) for p in value):
        return check_prompts(value, config, "prompt")
    prompts = [value] if is_token_ids(value) else value
    if not all(is_token_ids(p) for p in prompts):
        raise InvalidRequest(f"'prompt' must be {rule}; token ids are integers >= 0", param="prompt")
    _check_count(prompts, config, "prompt")
    for i, ids in enumerate(prompts):
        if not ids:
            raise InvalidRequest(f"'prompt[{i}]' is an empty list of token ids", param="prompt")
    return [tuple(ids) for ids in prompts]


def check_known(body: dict, known: frozenset[str]) -> None:
    """A 400 naming every field of `body` outside `known`, each with its nearest known name."""
    unknown = [name for name in body if name not in known]
    if not unknown:
        return
    described = []
    for name in unknown:
        near = difflib.get_close_matches(name, sorted(known), n=1)
        described.append(f"'{name}'" + (f" (did you mean '{near[0]}'?)" if near else ""))
    raise UnknownField(
        f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(described)}; "
        f"this route takes {', '.join(sorted(known))}",
        param=unknown[0],
    )


def parse(
    request: Request, config: Config, *, single: bool = False, extra: frozenset[str] = frozenset()
) -> GenerateRequest:
    """`single`: the body has one "prompt" string instead of a "prompts" list; `extra`: the
    route's own fields besides the demo routes' (the race page's)."""
    body = json_body(request)
    key = "prompt" if single else "prompts"
    check_known(body, DEMO_FIELDS | extra | {key})
    if key not in body:
        raise InvalidRequest(f"'{key}' is required", param=key)
    prompts = [body[key]] if single else body[key]
    if not isinstance(prompts, list):
        raise InvalidRequest("'prompts' must be a list of strings", param=key)
    check_prompts(prompts, config, key)
    params = parse_sampling(body, config, default_temperature=0.0)
    n = parse_n(body, config)
    if single and n != 1:  # one prompt, one text (or one stream of events): no room for more
        raise InvalidRequest(f"'n' must be 1 on this route, got {n}; use /generate or /generate_vllm", param="n")
    prompts = context.fit(prompts, body, params.max_tokens, key)
    return GenerateRequest(prompts=prompts, params=params, details=flag(body, "details"), n=n)


def from_request(*, single: bool = False, extra: frozenset[str] = frozenset()) -> GenerateRequest:
    """Parse the current Flask request with the app's settings."""
    return parse(request, current_app.config["SERVICE"], single=single, extra=extra)
