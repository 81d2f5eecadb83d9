"""Sequence: one prompt's trip through a batcher, and the object its request thread waits on."""

from __future__ import annotations

import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from enum import StrEnum

from batcher.grammar import StructuredSpec


@dataclass(frozen=True)
class SamplingParams:
    """Per prompt, even inside one round. temperature 0 means greedy. Meanings and ranges are
    vLLM's (service/params.py validates them); the neutral defaults change nothing."""

    max_tokens: int = 20
    temperature: float = 0.0
    top_p: float = 1.0
    ignore_eos: bool = False  # generate exactly max_tokens (benchmarks: equal work on every path)
    stop: tuple[str, ...] = ()  # end when the text contains one; it is cut off, reason "stop"
    stop_token_ids: tuple[int, ...] = ()  # end on one of these tokens (not returned), reason "stop"
    seed: int | None = None  # sampled rows draw from their own generator: reproducible per engine
    logprobs: int | None = None  # top alternatives per generated token; None: no logprobs at all
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    top_k: int = -1  # -1 (or 0): every token
    min_p: float = 0.0
    min_tokens: int = 0  # EOS, stop_token_ids and stop strings only count after this many tokens
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs, sorted by id
    structured: StructuredSpec | None = None  # the text's grammar, compiled (batcher/grammar.py)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        return (self.presence_penalty, self.frequency_penalty, self.repetition_penalty) != (0.0, 0.0, 1.0)


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability under the model (before temperature, penalties and
    filters, as vLLM reports by default) and the `logprobs` most likely tokens at that step,
    most likely first, each as (token id, token text, logprob)."""

    token_id: int
    token: str
    logprob: float
    top: tuple[tuple[int, str, float], ...] = ()


class Status(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"


_ids = itertools.count(1)


def _next_id() -> str:
    return f"seq-{next(_ids)}"


@dataclass(eq=False)
class Sequence:
    """A prompt, its parameters and everything the engine hands back.

    The model thread writes the result fields and then sets `done`; the request thread reads
    them only after `done` is set. `cancel()` is the one thing the request thread writes: the
    engine reads it between steps and drops the sequence.
    """

    prompt: str
    params: SamplingParams = field(default_factory=SamplingParams)
    # where a streamed sequence puts (self, text) for each piece and (self, None) at its end; the
    # sequences of one streamed request share one queue, so their pieces arrive in step order
    pieces: queue.SimpleQueue | None = field(default=None, repr=False)
    solo: bool = False  # runs in a round of its own (the unbatched baseline, /basic_generate)
    id: str = field(default_factory=_next_id)
    status: Status = Status.QUEUED
    prompt_tokens: int | None = None  # as the engine tokenized (and maybe truncated) the prompt
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # "length" | "stop"
    # one per generated token whose text is returned (params.logprobs set); the engine appends
    # before it emits the text that covers the token
    logprobs: list[TokenLogprob] = field(default_factory=list)
    error: BaseException | None = None
    # batching details, filled in by the engine that ran it
    round: int | None = None
    batch_size: int | None = None
    batch_shape: tuple[int, ...] | None = None
    # timestamps (time.monotonic)
    created_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    finished_at: float | None = None
    done: threading.Event = field(default_factory=threading.Event, repr=False)
    # set when the engine takes it into a round or step, or resolves it without running it
    entered: threading.Event = field(default_factory=threading.Event, repr=False)
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def stream(self) -> bool:
        return self.pieces is not None

    # --- request thread side -------------------------------------------------------------
    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    # --- engine side ---------------------------------------------------------------------
    def start(self, round_no: int | str, batch_size: int, shape: tuple[int, ...] | None) -> None:
        self.status = Status.RUNNING
        self.started_at = time.monotonic()
        self.round, self.batch_size, self.batch_shape = round_no, batch_size, shape
        self.entered.set()

    def emit(self, delta: str) -> None:
        if delta and self.pieces is not None:
            self.pieces.put((self, delta))

    def finish(self, text: str, reason: str) -> None:
        self.text, self.finish_reason = text, reason
        self._close(Status.CANCELLED if self.cancelled else Status.FINISHED)

    def fail(self, error: BaseException) -> None:
        self.error = error
        self._close(Status.FAILED)

    def _close(self, status: Status) -> None:
        if self.done.is_set():
            return
        self.status = status
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
    def inference_ms(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.started_at) * 1000
