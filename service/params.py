"""The sampling parameters of a request body, parsed and validated once for every route.

Ranges and meanings are vLLM's (they are what its engine accepts, and the static path follows
them); an invalid value raises `InvalidRequest` naming the field, before anything is enqueued.
The demo routes call `parse_sampling(..., default_temperature=0.0)` (greedy unless asked), the
OpenAI routes pass 1.0, OpenAI's default.
"""

from __future__ import annotations

import math

from batcher.sampling import SamplingParams
from service.config import Config
from service.errors import InvalidRequest
from service.structured import parse_structured

MAX_STOP = 4  # stop strings per request (OpenAI's limit)
MAX_STOP_TOKEN_IDS = 64
MAX_LOGPROBS = 5  # top alternatives per token (OpenAI completions' limit)
MAX_LOGIT_BIAS = 300  # entries (OpenAI's limit)
SEED_RANGE = (-(2**63), 2**63 - 1)


def _int(body: dict, key: str, default, check, rule: str):
    value = body.get(key)
    if value is None:
        return default
    # bool is an int in Python; a JSON true is not a number
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"'{key}' must be an integer, got {value!r}", param=key)
    if not check(value):
        raise InvalidRequest(f"'{key}' must be {rule}, got {value!r}", param=key)
    return value


def _float(body: dict, key: str, default: float, check, rule: str) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequest(f"'{key}' must be a number, got {value!r}", param=key)
    if not math.isfinite(value) or not check(value):  # Python's JSON reads NaN and Infinity
        raise InvalidRequest(f"'{key}' must be {rule}, got {value!r}", param=key)
    return float(value)


def _stop(body: dict) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOP:
        raise InvalidRequest(f"'stop' must be a non-empty string or a list of up to {MAX_STOP} of them", param="stop")
    return tuple(dict.fromkeys(stops))


def _stop_token_ids(body: dict) -> tuple[int, ...]:
    value = body.get("stop_token_ids")
    if value is None:
        return ()
    if (
        not isinstance(value, list)
        or len(value) > MAX_STOP_TOKEN_IDS
        or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    ):
        rule = f"a list of up to {MAX_STOP_TOKEN_IDS} token ids (integers >= 0)"
        raise InvalidRequest(f"'stop_token_ids' must be {rule}", param="stop_token_ids")
    return tuple(dict.fromkeys(value))


def _logit_bias(body: dict) -> tuple[tuple[int, float], ...]:
    value = body.get("logit_bias")
    if value is None:
        return ()
    rule = f"an object of up to {MAX_LOGIT_BIAS} token ids (as strings) to numbers in -100..100"
    if not isinstance(value, dict) or len(value) > MAX_LOGIT_BIAS:
        raise InvalidRequest(f"'logit_bias' must be {rule}", param="logit_bias")
    pairs = {}
    for key, bias in value.items():
        try:
            token = int(key)
        except ValueError:
            token = -1
        numeric = isinstance(bias, (int, float)) and not isinstance(bias, bool)
        if token < 0 or not numeric or not math.isfinite(bias) or not -100 <= bias <= 100:
            raise InvalidRequest(f"'logit_bias' must be {rule}; got {key!r}: {bias!r}", param="logit_bias")
        pairs[token] = float(bias)
    return tuple(sorted(pairs.items()))


def parse_sampling(
    body: dict, config: Config, *, default_temperature: float, max_tokens_key: str = "max_tokens"
) -> SamplingParams:
    """Every sampling field of `body` (absent or null: the default). `max_tokens_key`: the field
    that holds max_tokens (chat's `max_completion_tokens`, where it is set)."""
    limit = config.max_new_tokens_limit
    max_tokens = _int(body, max_tokens_key, config.max_new_tokens, lambda v: 1 <= v <= limit, f"in 1..{limit}")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise InvalidRequest("'ignore_eos' must be true or false", param="ignore_eos")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=_float(body, "temperature", default_temperature, lambda v: 0 <= v <= 2, "in 0..2 (0: greedy)"),
        top_p=_float(body, "top_p", 1.0, lambda v: 0 < v <= 1, "in (0, 1]"),
        ignore_eos=ignore_eos,
        stop=_stop(body),
        stop_token_ids=_stop_token_ids(body),
        seed=_int(body, "seed", None, lambda v: SEED_RANGE[0] <= v <= SEED_RANGE[1], "a 64-bit signed integer"),
        logprobs=_int(body, "logprobs", None, lambda v: 0 <= v <= MAX_LOGPROBS, f"in 0..{MAX_LOGPROBS}"),
        presence_penalty=_float(body, "presence_penalty", 0.0, lambda v: -2 <= v <= 2, "in -2..2"),
        frequency_penalty=_float(body, "frequency_penalty", 0.0, lambda v: -2 <= v <= 2, "in -2..2"),
        repetition_penalty=_float(body, "repetition_penalty", 1.0, lambda v: v > 0, "> 0 (1: none)"),
        top_k=_int(body, "top_k", -1, lambda v: v >= -1, "-1 or 0 (every token) or >= 1"),
        min_p=_float(body, "min_p", 0.0, lambda v: 0 <= v <= 1, "in 0..1"),
        min_tokens=_int(body, "min_tokens", 0, lambda v: 0 <= v <= max_tokens, f"in 0..max_tokens ({max_tokens})"),
        logit_bias=_logit_bias(body),
        structured=parse_structured(body, config),
    )


def parse_n(body: dict, config: Config) -> int:
    """Completions per prompt: 1..MAX_N, default 1."""
    return _int(body, "n", 1, lambda v: 1 <= v <= config.max_n, f"in 1..{config.max_n}")


def chat_logprobs(body: dict) -> dict:
    """Chat's `logprobs: true` + `top_logprobs: k` as the one `logprobs: k` field that
    `parse_sampling` reads (a copy of `body`); `top_logprobs` without `logprobs: true` is refused."""
    wanted, top = body.get("logprobs"), body.get("top_logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise InvalidRequest("'logprobs' must be true or false", param="logprobs")
    if top is not None and not wanted:
        raise InvalidRequest("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    if top is not None:
        _int(body, "top_logprobs", None, lambda v: 0 <= v <= MAX_LOGPROBS, f"in 0..{MAX_LOGPROBS}")
    return {**body, "logprobs": (top or 0) if wanted else None}


def parse_prompt_logprobs(body: dict, default: int | None, *, stream: bool) -> int | None:
    """vLLM's `prompt_logprobs`: top alternatives per prompt token, 0..MAX_LOGPROBS; without it,
    `default` (what `echo` asks for). Not with `stream` (vLLM's rule: chunks carry no prompt
    logprobs), but 0, which asks for no alternatives."""
    value = _int(body, "prompt_logprobs", None, lambda v: 0 <= v <= MAX_LOGPROBS, f"in 0..{MAX_LOGPROBS}")
    if value and stream:
        raise InvalidRequest("'prompt_logprobs' are not available with 'stream': true", param="prompt_logprobs")
    return default if value is None else value
