"""The demo API's reply shapes: {"generated_texts": [...]} with its details, logprobs and timing
headers, and the events of its streams (which the race page's feed sends too)."""

from __future__ import annotations

from collections.abc import Iterator

from flask import Response, jsonify

from batcher.sequence import Sequence
from service import batching
from service.errors import ApiError, describe, error_body, message
from service.generation import Pieces
from service.http import sse
from service.plan import Plan

# what a stream's first event (with `details`) says: what is known once the sequence has entered
START_DETAILS = ("sequence_id", "round", "batch_size", "batch_shape", "queue_ms")


def _seconds(values) -> str:
    values = [v for v in values if v is not None]
    return f"{max(values) / 1000:.4f}" if values else "0"


def detail(seq: Sequence) -> dict:
    return {
        **batching.cost(seq),  # queue_ms, round, shared_with and what sharing cost it
        "sequence_id": seq.id,
        "batch_size": seq.batch_size,
        "batch_shape": list(seq.batch_shape) if seq.batch_shape else None,
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


def reply(seqs: list[Sequence], plan: Plan, *, single: bool = False) -> Response:
    """The JSON answer, completions in prompt order (no prompt echo; with n > 1, each prompt's n
    in a row), a "logprobs" list per text when asked, with timing headers."""
    if single:
        body = {"generated_text": seqs[0].text}
    else:
        body = {"generated_texts": [seq.text for seq in seqs]}
    if plan.logprobs:
        body["logprobs"] = token_logprobs(seqs[0]) if single else [token_logprobs(seq) for seq in seqs]
    if plan.details:
        body["details"] = [detail(seq) for seq in seqs]
    response = jsonify(body)
    # the longest wait and the longest run among the request's prompts, in seconds
    response.headers["x-queue-time"] = _seconds(seq.queue_ms for seq in seqs)
    response.headers["x-inference-time"] = _seconds(seq.inference_ms for seq in seqs)
    return response


# --- the events of a stream, one payload each ------------------------------------------------


def error(exc: BaseException) -> dict:
    """What the demo routes answer for `exc`, with its status: {"error", "type", "status"}."""
    status, type_ = describe(exc)
    return {**error_body(message(exc), type_), "status": status}


def started(seq: Sequence) -> dict:
    """The round (or vLLM step) the sequence entered, its batch and its queue time."""
    return {key: value for key, value in detail(seq).items() if key in START_DETAILS}


def piece(seq: Sequence, text: str) -> dict:
    return {"token": text, "sequence_id": seq.id}


def failed(seq: Sequence, exc: BaseException) -> dict:
    return {"sequence_id": seq.id, **error(exc)}


def ended(seq: Sequence, *, logprobs: bool = False) -> dict:
    """The last event of a sequence: its finish reason (and logprobs if asked), or its error."""
    if seq.error is not None:
        return failed(seq, seq.error)
    last = {"sequence_id": seq.id, "finish_reason": seq.finish_reason, "done": True}
    if logprobs:
        last["logprobs"] = token_logprobs(seq)
    return last


def events(pieces: Pieces, *, details: bool = False, logprobs: bool = False) -> Iterator[str]:
    """One `data:` event per piece of text, then one with the finish reason (or the error).
    `details`: first an event with the round (or vLLM step) the sequence entered, its batch and
    its queue time (the race page draws rounds with it)."""
    seq = pieces.seqs[0]
    try:
        if details:
            yield sse.event(started(seq))
        for seq, text in pieces:
            yield sse.event(piece(seq, text) if text is not None else ended(seq, logprobs=logprobs))
    except ApiError as exc:  # the deadline, mid-stream
        yield sse.event(failed(seq, exc))
    finally:
        # Runs on normal end and when the client went away (the server closes the generator):
        # either way the engine stops spending compute on this request.
        pieces.close()
