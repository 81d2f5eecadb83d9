"""The request body of every generate endpoint, parsed and validated in one place."""

from __future__ import annotations

from dataclasses import dataclass

from flask import Request, current_app, request
from werkzeug.exceptions import BadRequest

from batcher.sequence import SamplingParams
from service.config import Config
from service.errors import InvalidJson, InvalidRequest, TooManyPrompts


@dataclass(frozen=True)
class GenerateRequest:
    prompts: list[str]
    params: SamplingParams
    details: bool = False


def _number(body: dict, key: str, default, kind, check, rule: str):
    value = body.get(key, default)
    if value is None:
        return default
    # bool is an int in Python; a JSON true is not a number of tokens
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        what = "an integer" if kind is int else "a number"
        raise InvalidRequest(f"'{key}' must be {what}, got {value!r}", param=key)
    if not check(value):
        raise InvalidRequest(f"'{key}' must be {rule}, got {value!r}", param=key)
    return kind(value)


def flag(body: dict, key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequest(f"'{key}' must be true or false", param=key)
    return value


def json_body(request: Request) -> dict:
    try:
        body = request.get_json(force=True)  # the body is JSON whatever the Content-Type says
    except BadRequest as exc:
        raise InvalidJson("request body is not valid JSON") from exc
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    return body


def check_prompts(prompts: list, config: Config, key: str) -> list[str]:
    """Every prompt a non-empty string, at most MAX_PROMPTS_PER_REQUEST of them."""
    if len(prompts) > config.max_prompts_per_request:
        raise TooManyPrompts(f"{len(prompts)} prompts; at most {config.max_prompts_per_request} per request", param=key)
    for i, prompt in enumerate(prompts):
        where = f"'{key}[{i}]'" if len(prompts) > 1 or key == "prompts" else f"'{key}'"
        if not isinstance(prompt, str):
            raise InvalidRequest(f"{where} must be a string, got {type(prompt).__name__}", param=key)
        if not prompt.strip():
            raise InvalidRequest(f"{where} is empty", param=key)
    return prompts


def sampling(body: dict, config: Config, *, default_temperature: float = 0.0) -> SamplingParams:
    """The sampling parameters of any generate route, demo or OpenAI (which defaults to 1.0)."""
    limit = config.max_new_tokens_limit
    return SamplingParams(
        max_tokens=_number(body, "max_tokens", config.max_new_tokens, int, lambda v: 1 <= v <= limit, f"in 1..{limit}"),
        temperature=_number(
            body, "temperature", default_temperature, float, lambda v: 0 <= v <= 100, "in 0..100 (0: greedy)"
        ),
        top_p=_number(body, "top_p", 1.0, float, lambda v: 0 < v <= 1, "in (0, 1]"),
        ignore_eos=flag(body, "ignore_eos"),
    )


def parse(request: Request, config: Config, *, single: bool = False) -> GenerateRequest:
    """`single`: the body has one "prompt" string instead of a "prompts" list."""
    body = json_body(request)

    key = "prompt" if single else "prompts"
    if key not in body:
        raise InvalidRequest(f"'{key}' is required", param=key)
    prompts = [body[key]] if single else body[key]
    if not isinstance(prompts, list):
        raise InvalidRequest("'prompts' must be a list of strings", param=key)
    check_prompts(prompts, config, key)
    return GenerateRequest(prompts=prompts, params=sampling(body, config), details=flag(body, "details"))


def from_request(*, single: bool = False) -> GenerateRequest:
    """Parse the current Flask request with the app's settings."""
    return parse(request, current_app.config["SERVICE"], single=single)
