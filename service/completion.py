"""What every generate view does, whichever engine serves it: submit, wait, answer.

Both engines take `Sequence`s through `submit()` and set each one's `done` event; the views only
choose the engine and shape the reply.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import time
from collections.abc import Iterator
from typing import Protocol

from flask import Response, current_app, jsonify, stream_with_context

from batcher.sequence import SamplingParams, Sequence
from service.errors import DeadlineExceeded, describe, error_body
from service.schema import GenerateRequest


class Engine(Protocol):
    name: str

    def submit(self, seqs: list[Sequence]) -> None: ...


def engine(name: str) -> Engine:
    return current_app.extensions["engines"][name]


def _timeout() -> float:
    return current_app.config["SERVICE"].request_timeout_s


def _raise_first_error(seqs: list[Sequence]) -> None:
    for seq in seqs:
        if seq.error is not None:
            raise seq.error


def fan_out(prompts: list[str], params: SamplingParams, n: int = 1, *, stream: bool = False) -> list[Sequence]:
    """n sequences per prompt, grouped per prompt in order (prompt 0's n, then prompt 1's...).
    With a seed, the i-th of a prompt's n gets seed + i, as vLLM does for its own n: n draws
    that differ, each reproducible."""
    per_copy = [params if params.seed is None else dataclasses.replace(params, seed=params.seed + i) for i in range(n)]
    return [Sequence(prompt, p, stream=stream) for prompt in prompts for p in per_copy]


def complete(eng: Engine, req: GenerateRequest) -> list[Sequence]:
    """Run every prompt of `req` (n times each) on `eng` and wait for all, or fail the request."""
    seqs = fan_out(req.prompts, req.params, req.n)
    if not seqs:
        return seqs
    eng.submit(seqs)
    deadline = time.monotonic() + _timeout()
    for seq in seqs:
        if not seq.done.wait(max(0.0, deadline - time.monotonic())):
            for s in seqs:  # skipped if still queued, dropped at the next step if running
                s.cancel()
            raise DeadlineExceeded(f"request took longer than {_timeout():g}s")
    _raise_first_error(seqs)
    return seqs


def _seconds(values) -> str:
    values = [v for v in values if v is not None]
    return f"{max(values) / 1000:.4f}" if values else "0"


def detail(seq: Sequence) -> dict:
    return {
        "sequence_id": seq.id,
        "round": seq.round,
        "batch_size": seq.batch_size,
        "batch_shape": list(seq.batch_shape) if seq.batch_shape else None,
        "queue_ms": round(seq.queue_ms or 0.0, 2),
        "inference_ms": round(seq.inference_ms or 0.0, 2),
        "tokens": len(seq.token_ids),
        "finish_reason": seq.finish_reason,
    }


def logprobs(seq: Sequence) -> list[dict]:
    """Per generated token: its text, id, logprob and the top alternatives, most likely first."""
    return [
        {
            "token": r.token,
            "token_id": r.token_id,
            "logprob": r.logprob,
            "top_logprobs": [{"token": text, "token_id": tid, "logprob": lp} for tid, text, lp in r.top],
        }
        for r in seq.logprobs
    ]


def reply(seqs: list[Sequence], req: GenerateRequest, *, single: bool = False) -> Response:
    """The JSON answer, completions in prompt order (no prompt echo; with n > 1, each prompt's n
    in a row), a "logprobs" list per text when asked, with timing headers."""
    if single:
        body = {"generated_text": seqs[0].text}
    else:
        body = {"generated_texts": [seq.text for seq in seqs]}
    if req.params.logprobs is not None:
        body["logprobs"] = logprobs(seqs[0]) if single else [logprobs(seq) for seq in seqs]
    if req.details:
        body["details"] = [detail(seq) for seq in seqs]
    response = jsonify(body)
    # the longest wait and the longest run among the request's prompts, in seconds
    response.headers["x-queue-time"] = _seconds(seq.queue_ms for seq in seqs)
    response.headers["x-inference-time"] = _seconds(seq.inference_ms for seq in seqs)
    return response


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def stream(eng: Engine, req: GenerateRequest) -> Response:
    """Server-sent events: one `data:` event per piece of text, then one with the finish reason.

    We wait for the first piece before answering, so that an error before the first token is
    a plain JSON error with its status code; after it, an error is the stream's last event.
    """
    seq = Sequence(req.prompts[0], req.params, stream=True)
    eng.submit([seq])
    timeout = _timeout()
    deadline = time.monotonic() + timeout

    def next_piece() -> str | None:
        try:
            return seq.deltas.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            seq.cancel()
            raise DeadlineExceeded(f"request took longer than {timeout:g}s") from None

    first = next_piece()
    if first is None:
        _raise_first_error([seq])

    def events() -> Iterator[str]:
        try:
            piece = first
            while piece is not None:
                yield _event({"token": piece, "sequence_id": seq.id})
                piece = next_piece()
            if seq.error is not None:
                status, type_ = describe(seq.error)
                yield _event({"sequence_id": seq.id, **error_body(str(seq.error), type_), "status": status})
            else:
                last = {"sequence_id": seq.id, "finish_reason": seq.finish_reason, "done": True}
                if req.params.logprobs is not None:
                    last["logprobs"] = logprobs(seq)
                yield _event(last)
        except DeadlineExceeded as exc:
            yield _event({"sequence_id": seq.id, **error_body(str(exc), exc.type), "status": exc.status})
        finally:
            # Runs on normal end and when the client went away (the server closes the
            # generator): either way the engine stops spending compute on this sequence.
            seq.cancel()

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return Response(stream_with_context(events()), mimetype="text/event-stream", headers=headers)
