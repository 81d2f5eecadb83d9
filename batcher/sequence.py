"""Sequence: one prompt's trip through a batcher, and the object its request thread waits on."""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum

from batcher.predict import Prediction
from batcher.sampling import SamplingParams
from batcher.tokens import Piece, TokenLogprob


class Priority(IntEnum):
    """Who goes first, lower first as vLLM's `priority`: a batch line takes only the room that
    interactive work leaves (the workload hands it out last; vLLM schedules it last)."""

    INTERACTIVE = 0
    BATCH = 1


class Status(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"


# A prompt: text, or token ids (the tokenizer's own, as an evaluation harness sends them).
# Either way it runs whole: the service refuses one longer than MAX_INPUT_TOKENS, or cuts it to
# its last `truncate_prompt_tokens` when asked (service/context_length.py); an engine never cuts it.
Prompt = str | tuple[int, ...]

_ids = itertools.count(1)


def _next_id() -> str:
    return f"seq-{next(_ids)}"


@dataclass(eq=False)
class Sequence:
    """A prompt, its parameters and everything the engine hands back.

    Who writes what, and when it may be read:
    - the engine thread writes the result (`token_ids`, `logprobs`, `text`, `prompt_tokens`, then
      `finish_reason` or `error`) only through the methods below, `start` -> `add_tokens` /
      `add_text` -> `finish` or `fail`; the last sets `finished_at`, puts the end marker and
      sets `done`. The request thread reads the result once `done` is set (or once it took the
      end marker `(self, None)` from `pieces`, which comes after every write).
    - with `params.prompt_logprobs`, the engine writes `prompt_logprobs` (one record per prompt
      token) before the sequence's first token.
    - `start` writes the round's details (`round`, `batch_size`, `batch_shape`, `padding` or
      `prefilled_ahead`, `started_at`) and then sets `entered`: those may be read from then on.
    - while the sequence runs, a streamed request reads only what each piece carries: the text,
      its logprob records (`Piece.logprobs`) and token count; and `prompt_tokens`, which the
      engine writes before the sequence's first token.
    - `cancel()` is the one thing the request thread writes: the engine reads it between steps
      and drops the sequence.
    `status` is not stored: it follows from these events.
    """

    prompt: Prompt
    params: SamplingParams = field(default_factory=SamplingParams)
    # where a streamed sequence puts (self, Piece) for each piece and (self, None) at its end; the
    # sequences of one streamed request share one queue, so their pieces arrive in step order
    pieces: queue.SimpleQueue | None = field(default=None, repr=False)
    solo: bool = False  # runs in a round of its own (the unbatched baseline, /basic_generate)
    priority: Priority = Priority.INTERACTIVE
    id: str = field(default_factory=_next_id)
    prompt_tokens: int | None = None  # as the engine tokenized the prompt
    token_ids: list[int] = field(default_factory=list)
    text: str = ""  # the pieces so far, joined; the completion once done
    finish_reason: str | None = None  # "length" | "stop" | "cancelled"
    # one per generated token whose text is returned (params.logprobs set)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob] | None = None  # params.prompt_logprobs set: one per prompt token
    error: BaseException | None = None
    # batching details, filled in by the engine that ran it
    round: int | str | None = None
    batch_size: int | None = None
    batch_shape: tuple[int, ...] | None = None
    padding: int | None = None  # static: pad tokens in its round's prompts (all rows together)
    prefilled_ahead: int | None = None  # vLLM: sequences admitted at its step before it
    # timestamps (time.monotonic)
    created_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    first_token_at: float | None = None  # set by add_tokens when the first token arrives
    last_token_at: float | None = None  # and when the latest one did
    finished_at: float | None = None
    # what the engine predicted when it admitted it (batcher/predict.py), None if it could not
    predicted: Prediction | None = None
    done: threading.Event = field(default_factory=threading.Event, repr=False)
    # set when the engine takes it into a round or step, or resolves it without running it
    entered: threading.Event = field(default_factory=threading.Event, repr=False)
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    _covered: int = field(default=0, repr=False)  # logprob records already handed out with a piece
    _pieced: int = field(default=0, repr=False)  # tokens already handed out with a piece

    @property
    def stream(self) -> bool:
        return self.pieces is not None

    @property
    def status(self) -> Status:
        if self.done.is_set():
            if self.error is not None:
                return Status.FAILED
            return Status.CANCELLED if self.finish_reason == "cancelled" else Status.FINISHED
        return Status.QUEUED if self.started_at is None else Status.RUNNING

    # --- request thread side -------------------------------------------------------------
    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    # --- engine side ---------------------------------------------------------------------
    def start(
        self,
        round_no: int | str,
        batch_size: int,
        shape: tuple[int, ...] | None,
        *,
        padding: int | None = None,
        prefilled_ahead: int | None = None,
    ) -> None:
        self.started_at = time.monotonic()
        self.round, self.batch_size, self.batch_shape = round_no, batch_size, shape
        self.padding, self.prefilled_ahead = padding, prefilled_ahead
        self.entered.set()

    def add_tokens(self, token_ids: Iterable[int], logprobs: Iterable[TokenLogprob] = ()) -> None:
        """Generated tokens (and their records), before the text that covers them."""
        had = len(self.token_ids)
        self.token_ids.extend(token_ids)
        if len(self.token_ids) > had:
            self.last_token_at = time.monotonic()
            if not had:
                self.first_token_at = self.last_token_at
        self.logprobs.extend(logprobs)

    def add_text(self, delta: str) -> None:
        """The next piece of the completion; a streamed sequence hands it out at once, with the
        records of the tokens added since the last piece. The first token makes a piece even if
        its text is held back (the detokenizer waiting for the rest of a character or word, a
        possible stop string): an empty one, as vLLM's server sends a chunk for it, so that a
        stream's first event comes with its first token, which is what its time to first token
        measures (vLLM's detokenizer holds back the first token of about half the bench's
        prompts, which then came a whole step late)."""
        if not delta and (self._pieced or not self.token_ids):
            return
        self.text += delta
        if self.pieces is not None:
            records, self._covered = tuple(self.logprobs[self._covered :]), len(self.logprobs)
            self._pieced = len(self.token_ids)
            self.pieces.put((self, Piece(delta, records, self._pieced)))

    def finish(self, reason: str) -> None:
        """Done with what it was given: `text` is the completion."""
        if not self.done.is_set():
            self.finish_reason = reason
        self._close()

    def fail(self, error: BaseException) -> None:
        if not self.done.is_set():
            self.error = error
        self._close()

    def _close(self) -> None:
        if self.done.is_set():
            return
        self.finished_at = time.monotonic()
        if self.pieces is not None:
            self.pieces.put((self, None))
        self.entered.set()
        self.done.set()

    @property
    def queue_ms(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.started_at - self.created_at) * 1000

    @property
    def ttft_s(self) -> float | None:
        """From submission to its first token."""
        return None if self.first_token_at is None else self.first_token_at - self.created_at

    @property
    def inference_ms(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.started_at) * 1000
