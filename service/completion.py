"""What every generate view does, whichever engine and whichever API: submit, wait, answer.

Both engines take `Sequence`s through `submit()` and set each one's `done` event; the views only
choose the engine and shape the reply. Streaming is split in two: `Pieces` is the engine side
(submit, wait for the first piece, deadline, cancel on close), written once; each API formats
the pieces into its own server-sent events (`demo_events` here, OpenAI's in openai_api.py).
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
from service.errors import ApiError, DeadlineExceeded, describe, error_body
from service.schema import GenerateRequest


class Engine(Protocol):
    name: str

    def submit(self, seqs: list[Sequence]) -> None: ...


def engine(name: str) -> Engine:
    return current_app.extensions["engines"][name]


def _timeout() -> float:
    return current_app.config["SERVICE"].request_timeout_s


def _deadline_exceeded() -> DeadlineExceeded:
    return DeadlineExceeded(f"request took longer than {_timeout():g}s")


def fan_out(
    prompts: list[str], params: SamplingParams, n: int = 1, *, pieces: queue.SimpleQueue | None = None, solo=False
) -> list[Sequence]:
    """n sequences per prompt, grouped per prompt in order (prompt 0's n, then prompt 1's...).
    With a seed, the i-th of a prompt's n gets seed + i, as vLLM does for its own n: n draws
    that differ, each reproducible. `pieces`: the queue a streamed request reads; `solo`: each
    runs in a round of its own (static engine)."""
    per_copy = [params if params.seed is None else dataclasses.replace(params, seed=params.seed + i) for i in range(n)]
    return [Sequence(prompt, p, pieces=pieces, solo=solo) for prompt in prompts for p in per_copy]


def complete(eng: Engine, prompts: list[str], params: SamplingParams, n: int = 1, *, solo=False) -> list[Sequence]:
    """Run every prompt (n times each) on `eng` and wait for all of them, or fail the request."""
    seqs = fan_out(prompts, params, n, solo=solo)
    if not seqs:
        return seqs
    eng.submit(seqs)
    deadline = time.monotonic() + _timeout()
    for seq in seqs:
        if not seq.done.wait(max(0.0, deadline - time.monotonic())):
            for s in seqs:  # skipped if still queued, dropped at the next step if running
                s.cancel()
            raise _deadline_exceeded()
    for seq in seqs:
        if seq.error is not None:
            raise seq.error
    return seqs


class Pieces:
    """The engine side of a streamed request: iterate `(sequence, text)` for each piece of text
    as its decoding step produces it, and `(sequence, None)` when that sequence has ended (its
    `finish_reason` or `error` is then set); the iteration ends when every sequence has.

    The constructor submits and waits for the first piece, so that an error before it (queue
    full, engine down, deadline, a failed first round) raises in the view and becomes a plain
    HTTP error with its status code (with `until_entered`, only until the sequence entered its
    round). After that, a deadline raises `DeadlineExceeded` from the iteration. `close()`
    cancels whatever still runs: call it when the client is gone.
    """

    def __init__(self, eng: Engine, prompts: list[str], params: SamplingParams, n: int = 1, *, until_entered=False):
        """`until_entered`: answer as soon as the (first) sequence enters its round or step, not at
        its first piece, so that a details event can go first; an error before that point still
        raises here."""
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.seqs = fan_out(prompts, params, n, pieces=self._queue)
        eng.submit(self.seqs)
        self._deadline = time.monotonic() + _timeout()
        self._timeout_error = _deadline_exceeded()
        if until_entered:
            seq, self._first = self.seqs[0], None
            if not seq.entered.wait(max(0.0, self._deadline - time.monotonic())):
                self.close()
                raise self._timeout_error
            failed = seq.started_at is None and seq.error is not None  # resolved without running
        else:
            self._first = self._next()
            seq = self._first[0]
            failed = self._first[1] is None and seq.error is not None
        if failed:
            self.close()
            raise seq.error

    def _next(self) -> tuple[Sequence, str | None]:
        try:
            return self._queue.get(timeout=max(0.0, self._deadline - time.monotonic()))
        except queue.Empty:
            self.close()
            raise self._timeout_error from None

    def __iter__(self) -> Iterator[tuple[Sequence, str | None]]:
        piece, open_ = self._first or self._next(), len(self.seqs)
        while True:
            yield piece
            if piece[1] is None:
                open_ -= 1
                if not open_:
                    return
            piece = self._next()

    def close(self) -> None:
        for seq in self.seqs:  # a no-op for sequences that already ended
            seq.cancel()


def sse(events: Iterator[str]) -> Response:
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return Response(stream_with_context(events), mimetype="text/event-stream", headers=headers)


def event(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


# --- the demo API: {"prompts": [...]} in, {"generated_texts": [...]} out ---------------------


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


def token_logprobs(seq: Sequence) -> list[dict]:
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
        body["logprobs"] = token_logprobs(seqs[0]) if single else [token_logprobs(seq) for seq in seqs]
    if req.details:
        body["details"] = [detail(seq) for seq in seqs]
    response = jsonify(body)
    # the longest wait and the longest run among the request's prompts, in seconds
    response.headers["x-queue-time"] = _seconds(seq.queue_ms for seq in seqs)
    response.headers["x-inference-time"] = _seconds(seq.inference_ms for seq in seqs)
    return response


START_DETAILS = ("sequence_id", "round", "batch_size", "batch_shape", "queue_ms")


def demo_events(pieces: Pieces, *, details: bool = False, logprobs: bool = False) -> Iterator[str]:
    """One `data:` event per piece of text, then one with the finish reason (or the error).
    `details`: first an event with the round (or vLLM step) the sequence entered, its batch and
    its queue time (the race page draws rounds with it)."""

    def failed(seq: Sequence, exc: BaseException) -> str:
        status, type_ = describe(exc)
        return event({"sequence_id": seq.id, **error_body(str(exc), type_), "status": status})

    seq = pieces.seqs[0]
    try:
        if details:
            yield event({key: value for key, value in detail(seq).items() if key in START_DETAILS})
        for seq, text in pieces:
            if text is not None:
                yield event({"token": text, "sequence_id": seq.id})
            elif seq.error is not None:
                yield failed(seq, seq.error)
            else:
                last = {"sequence_id": seq.id, "finish_reason": seq.finish_reason, "done": True}
                if logprobs:
                    last["logprobs"] = token_logprobs(seq)
                yield event(last)
    except ApiError as exc:  # the deadline, mid-stream
        yield failed(seq, exc)
    finally:
        # Runs on normal end and when the client went away (the server closes the generator):
        # either way the engine stops spending compute on this request.
        pieces.close()


def stream(eng: Engine, req: GenerateRequest) -> Response:
    pieces = Pieces(eng, req.prompts[:1], req.params, until_entered=req.details)
    return sse(demo_events(pieces, details=req.details, logprobs=req.params.logprobs is not None))
