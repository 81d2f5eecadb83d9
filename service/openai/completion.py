"""A /completions request's plan: its prompts as the engines run them, `echo`, and how it is answered."""

from __future__ import annotations

from service import context_length
from service.openai import echo
from service.plan import Plan, Served
from service.protocol.completion import Completion


def plan(req: Completion, served: Served) -> Plan:
    params = req.to_sampling_params(served.config)
    prompts = context_length.fit(
        req.prompts(), truncate=req.truncate_prompt_tokens, max_tokens=params.max_tokens, param="prompt",
        tokenizer=served.tokenizer, config=served.config,
    )  # fmt: skip
    # the echo is of the prompts as they run (cut where `truncate_prompt_tokens` asked)
    return req.to_plan(
        prompts, params, echo.for_completions(prompts, req.echo_only, served.tokenizer) if req.echo else None
    )
