"""What batching cost one sequence, as the demo routes' `details` and the OpenAI routes'
`batching` extension (with `"details": true`) show it: its wait, the round or step it ran in,
how many rows it shared it with, and what sharing cost it there."""

from __future__ import annotations

from batcher.sequence import Sequence


def cost(seq: Sequence) -> dict:
    """queue_ms, round (static: the round number; vLLM: "step-N", the step it joined at),
    shared_with (the other rows of that round, or the sequences running at that step); static:
    padding_tokens (pad tokens in its round's prompts, every row's) and finished_wait_ms (how long
    its row sat finished while the round's slowest row went on); vLLM: prefilled_ahead (the
    sequences admitted at its step before it, whose prefill shares that step)."""
    out = {
        "queue_ms": round(seq.queue_ms or 0.0, 2),
        "round": seq.round,
        "shared_with": max(0, (seq.batch_size or 1) - 1),
    }
    if seq.padding is not None:
        out["padding_tokens"] = seq.padding
        idle = None
        if seq.finished_at is not None and seq.last_token_at is not None:
            idle = round((seq.finished_at - seq.last_token_at) * 1000, 2)
        out["finished_wait_ms"] = idle
    if seq.prefilled_ahead is not None:
        out["prefilled_ahead"] = seq.prefilled_ahead
    return out
