"""The sampling parameters of a request body, as the engines take them, for every route.

Types and ranges are declared once, in service/protocol/sampling.py (vLLM's); an invalid value
raises `InvalidRequest` naming the field, before anything is enqueued. Here: the defaults
(absent or null: the neutral one; the demo routes pass `default_temperature=0.0`, greedy unless
asked, the OpenAI routes 1.0, OpenAI's), what crosses fields, and the translation.
"""

from __future__ import annotations

from batcher.grammar import StructuredSpec
from batcher.sampling import SamplingParams
from service.config import Config
from service.errors import InvalidRequest
from service.protocol import validate
from service.protocol.openai import ChatLogprobs
from service.protocol.sampling import Sampling
from service.structured import parse_structured

# the fields that go to SamplingParams as they are, when given
AS_GIVEN = """temperature top_p ignore_eos seed logprobs presence_penalty frequency_penalty repetition_penalty
top_k min_p min_tokens""".split()


def parse_sampling(
    body: dict,
    config: Config,
    *,
    default_temperature: float,
    max_tokens_key: str = "max_tokens",
    tool_grammar: StructuredSpec | None = None,
) -> SamplingParams:
    """Every sampling field of `body`. `max_tokens_key`: the field that holds max_tokens (chat's
    `max_completion_tokens`, where it is set); `tool_grammar`: the reply's grammar that the
    request's `tool_choice` asks for (service/tools/spec.py). The grammar is not compiled yet
    (service/structured.py's `compile_params`, at submit)."""
    if max_tokens_key != "max_tokens":
        body = {**body, "max_tokens": body.get(max_tokens_key)}
    fields = validate(Sampling, body, config)
    max_tokens = config.max_new_tokens if fields.max_tokens is None else fields.max_tokens
    if (fields.min_tokens or 0) > max_tokens:
        rule = f"in 0..max_tokens ({max_tokens})"
        raise InvalidRequest(f"'min_tokens' must be {rule}, got {fields.min_tokens}", param="min_tokens")
    given = {name: getattr(fields, name) for name in AS_GIVEN if getattr(fields, name) is not None}
    stops = [fields.stop] if isinstance(fields.stop, str) else fields.stop or []
    bias = {int(token): value for token, value in (fields.logit_bias or {}).items()}
    return SamplingParams(
        **{"temperature": default_temperature, **given},
        max_tokens=max_tokens,
        stop=tuple(dict.fromkeys(stops)),
        stop_token_ids=tuple(dict.fromkeys(fields.stop_token_ids or ())),
        logit_bias=tuple(sorted(bias.items())),
        structured=parse_structured(body, tool_grammar),
    )


def parse_n(body: dict, config: Config) -> int:
    """Completions per prompt: 1..MAX_N, default 1."""
    return validate(Sampling, body, config).n or 1


def chat_logprobs(body: dict) -> dict:
    """Chat's `logprobs: true` + `top_logprobs: k` as the one `logprobs: k` field that
    `parse_sampling` reads (a copy of `body`); `top_logprobs` without `logprobs: true` is refused."""
    fields = validate(ChatLogprobs, body, None)
    if fields.top_logprobs is not None and not fields.logprobs:
        raise InvalidRequest("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return {**body, "logprobs": (fields.top_logprobs or 0) if fields.logprobs else None}


def parse_prompt_logprobs(body: dict, default: int | None, *, stream: bool) -> int | None:
    """vLLM's `prompt_logprobs` (the route's model checked its range); without it, `default`
    (what `echo` asks for). Not with `stream` (vLLM's rule: chunks carry no prompt logprobs),
    but 0, which asks for no alternatives."""
    value = body.get("prompt_logprobs")
    if value and stream:
        raise InvalidRequest("'prompt_logprobs' are not available with 'stream': true", param="prompt_logprobs")
    return default if value is None else value
