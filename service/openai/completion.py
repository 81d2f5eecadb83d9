"""A /completions request's plan: its prompts as the engines run them, `echo`, and how it is answered."""

from __future__ import annotations

import dataclasses

from service import context
from service.openai import echo
from service.plan import Plan, Served
from service.protocol.completion import Completion


def plan(req: Completion, served: Served) -> Plan:
    params = req.to_sampling_params(served.config)
    prompts = context.fit(
        req.prompts(), truncate=req.truncate_prompt_tokens, max_tokens=params.max_tokens, param="prompt",
        tokenizer=served.tokenizer, config=served.config,
    )  # fmt: skip
    # the echo is of the prompts as they run (cut where `truncate_prompt_tokens` asked)
    echoed = echo.for_completions(prompts, req.echo_only, served.tokenizer) if req.echo else None
    return Plan(
        prompts=prompts,
        params=dataclasses.replace(params, prompt_logprobs=echo.prompt_logprobs(echoed, params, req.prompt_logprobs)),
        n=req.n or 1,
        stream=bool(req.stream),
        include_usage=req.include_usage,
        continuous_usage=req.continuous_usage,
        echo=echoed,
        details=bool(req.details),
        max_queue_ms=req.max_queue_ms,
    )
