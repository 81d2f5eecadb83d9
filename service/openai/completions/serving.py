"""`POST /v1/completions`, served: the prompts fitted to the context, `echo`, the plan, the run,
and the reply in /completions' shape: one choice per prompt (n per prompt), `text` in the reply
and in each chunk, logprobs as {tokens, token_logprobs, top_logprobs, text_offset}."""

from __future__ import annotations

import itertools

from flask import Response

from batcher.sequence import Sequence
from batcher.tokens import TokenLogprob
from service import context_length
from service.generation import RunFor
from service.openai import echo, serving
from service.openai.completions.protocol import Completion
from service.openai.serving import vllm_prompt_logprobs
from service.plan import Served


def create_completion(req: Completion, served: Served, run_for: RunFor) -> Response:
    params = req.to_sampling_params(served.config)
    prompts = context_length.fit(
        req.prompts(), truncate=req.truncate_prompt_tokens, max_tokens=params.max_tokens, param="prompt",
        tokenizer=served.tokenizer, config=served.config,
    )  # fmt: skip
    # the echo is of the prompts as they run (cut where `truncate_prompt_tokens` asked)
    echoed = echo.for_completions(prompts, req.echo_only, served.tokenizer) if req.echo else None
    plan = serving.plan(req, prompts, params, echoed)
    return serving.respond(TextShape(), run_for(plan.max_queue_ms), plan)


def logprobs(records: list[TokenLogprob] | None, offset: int = 0) -> dict | None:
    """`offset`: the characters before the first record's token."""
    if records is None:
        return None
    offsets = list(itertools.accumulate((len(r.token) for r in records[:-1]), initial=offset))
    return {
        "tokens": [r.token for r in records],
        "token_logprobs": [r.logprob for r in records],
        # an echoed prompt's first token: no alternatives either, as vLLM's null
        "top_logprobs": [None if r.logprob is None else {text: lp for _, text, lp in r.top} for r in records],
        "text_offset": offsets if records else [],
    }


class TextShape:
    prefix, object, chunk_object = "cmpl", "text_completion", "text_completion"

    def choice(self, index: int, seq: Sequence, text: str, records: list[TokenLogprob] | None) -> dict:
        choice = {"index": index, "text": text, "logprobs": logprobs(records), "finish_reason": seq.finish_reason}
        if seq.prompt_logprobs is not None:
            choice["prompt_logprobs"] = vllm_prompt_logprobs(seq.prompt_logprobs)
        return choice

    def extras(self, seqs: list[Sequence]) -> dict:
        return {}

    def opening(self, count: int) -> list[dict]:
        return []

    def deltas(self, index: int, text: str, records, offset: int, finish_reason: str | None) -> list[dict]:
        return [{"index": index, "text": text, "logprobs": logprobs(records, offset), "finish_reason": finish_reason}]
