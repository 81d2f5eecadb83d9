"""The context-length rule, in the request thread, before anything is enqueued: nothing is cut
without being asked.

A prompt longer than MAX_INPUT_TOKENS, or one whose prompt plus `max_tokens` is longer than the
model's length (`Config.max_model_len`), is a 400 `context_length_exceeded` naming both counts,
as vLLM's server words it (vllm/renderers/params.py, `_token_len_check`; the second as OpenAI and
vLLM before 0.10 word it: vLLM 0.32 lowers such a `max_tokens` instead, in `get_max_tokens`).

`truncate_prompt_tokens` (vLLM's field, vllm/entrypoints/openai/completion/protocol.py) opts in
to keeping a prompt's last k tokens (-1: MAX_INPUT_TOKENS). A chat prompt keeps its template's
fixed prefix whole (the system turn and the first user turn's role marker) and loses the tokens
right after it; a cut that would reach into that prefix is a 400.
"""

from __future__ import annotations

from batcher.sequence import Prompt
from service.config import Config
from service.errors import ApiError, InvalidRequest

FIELD = "truncate_prompt_tokens"


class ContextTooLong(ApiError):
    status, type = 400, "context_length_exceeded"  # OpenAI's code for it


def truncation(value: int | None, max_input_tokens: int) -> int | None:
    """A request's `truncate_prompt_tokens` as a number of tokens to keep, None to keep all."""
    if value is None:
        return None
    if value == 0:  # its type and the rest of its range: service/protocol/sampling.py
        raise InvalidRequest(f"'{FIELD}' must be -1 or an integer >= 1, got {value!r}", param=FIELD)
    if value > max_input_tokens:  # vLLM's words
        raise InvalidRequest(
            f"{FIELD}={value} cannot be greater than max_input_tokens = {max_input_tokens}. "
            "Please request a smaller truncation size.",
            param=FIELD,
        )
    return max_input_tokens if value == -1 else value


def fit(
    prompts: list[Prompt],
    *,
    truncate: int | None,
    max_tokens: int,
    param: str,
    tokenizer,
    config: Config,
    prefixes: list[str] | None = None,
) -> tuple[Prompt, ...]:
    """The prompts as the engines will run them: each one checked against the context length,
    cut to its last `truncate` (the request's `truncate_prompt_tokens`) tokens where it asks (then
    as token ids). `param`: the field the prompts came from, for the error; `prefixes`: per
    prompt, the text that must stay whole at its start (service/openai/chat/template.py)."""
    keep = truncation(truncate, config.max_input_tokens)
    fitted = []
    for i, prompt in enumerate(prompts):
        ids = tokenizer(prompt)["input_ids"] if isinstance(prompt, str) else list(prompt)
        if keep is not None and len(ids) > keep:
            fixed = len(tokenizer(prefixes[i])["input_ids"]) if prefixes else 0
            if fixed and keep <= fixed:
                raise ContextTooLong(
                    f"'{FIELD}'={keep} would cut into the chat template's head ({fixed} tokens: the system "
                    f"turn and the user's role marker); keep more tokens, or send fewer messages",
                    param=FIELD,
                )
            ids, prompt = ids[:fixed] + ids[len(ids) - (keep - fixed) :], None
        _check(len(ids), max_tokens, config.max_input_tokens, config.max_model_len, param)
        fitted.append(prompt if prompt is not None else tuple(ids))
    return tuple(fitted)


def _check(tokens: int, max_tokens: int, max_input: int, max_model_len: int, param: str) -> None:
    if tokens > max_input:
        raise ContextTooLong(
            f"This model's maximum context length is {max_model_len} tokens, of which at most {max_input} "
            f"for the prompt. However, your prompt contains {tokens} input tokens, which exceeds this limit "
            f"even without any output tokens. Please reduce the length of the input prompt, or send "
            f"'{FIELD}' to keep its last tokens.",
            param=param,
        )
    if tokens + max_tokens > max_model_len:
        raise ContextTooLong(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{tokens + max_tokens} tokens ({tokens} in the prompt, {max_tokens} in the completion). "
            f"Please reduce the length of the prompt or completion.",
            param=param,
        )
