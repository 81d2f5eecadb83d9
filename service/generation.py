"""The engine side of every generate request, whichever engine and whichever API: submit, wait.

Both engines take `Sequence`s through `submit()` and set each one's `done` event; the views only
choose the engine and shape the reply. `complete()` waits for whole texts; `Pieces` is the
engine side of a stream (submit, wait for the first piece, deadline, cancel on close), over a
`PieceQueue` (wait for the next piece until a deadline, cancel on close), which the race page's
feed reads too; each API shapes what they return (demo/replies.py, openai/replies.py). The view
hands them a `Run`: nothing here reads the app.
"""

from __future__ import annotations

import dataclasses
import queue
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from batcher.errors import WaitTooLong
from batcher.predict import Prediction
from batcher.sampling import SamplingParams
from batcher.sequence import Priority, Prompt, Sequence
from service import structured
from service.config import Config
from service.errors import DeadlineExceeded


class Engine(Protocol):
    name: str

    def check_available(self) -> None: ...  # raises what submit() would for any request

    # raises what submit() would for these sequences now, and enqueues nothing
    def check_admission(self, seqs: list[Sequence], *, max_ttft_s=None, max_total_s=None) -> Prediction: ...

    def submit(self, seqs: list[Sequence], *, max_ttft_s=None, max_total_s=None) -> Prediction: ...


@dataclass
class Run:
    """One request's way to its engine, made by its view (service/http/lookup.py): the engine, the
    request's deadlines (REQUEST_TIMEOUT_S for the whole, `max_ttft_s` for the first token, from
    X-Max-Queue-Ms or `max_queue_ms`), and the settings a grammar compiles with. `priority`: a
    batch line's run is `Priority.BATCH` (the engines give it only the room interactive work
    leaves). `predicted`: what the engine predicted at admission, admitted or refused, set by
    `submit` for the reply's `x-predicted-wait` header."""

    engine: Engine
    timeout_s: float
    max_ttft_s: float | None
    config: Config
    priority: Priority = Priority.INTERACTIVE
    predicted: Prediction | None = field(default=None, compare=False)


# A request's `Run` under its body's `max_queue_ms` (service/http/lookup.py `run`, the engine
# bound): a serving function asks for it once its plan is made, so that what the plan refuses
# (the context length) is answered before the run's own checks (X-Max-Queue-Ms).
RunFor = Callable[[float | None], Run]


def deadline_exceeded(timeout: float) -> DeadlineExceeded:
    return DeadlineExceeded(f"request took longer than {timeout:g}s")


def submit(
    run: Run,
    prompts: list[Prompt],
    params: SamplingParams,
    n: int = 1,
    *,
    pieces: queue.SimpleQueue | None = None,
    solo=False,
) -> list[Sequence]:
    """The request's sequences (`fan_out`), enqueued on the run's engine under the request's
    deadlines; the prediction, admitted or refused, is kept in `run.predicted`.

    A grammar is compiled here, last: after the context-length check (the views ran it) and after
    the engine's own dry run of its admission (nothing enqueued), so that a request refused with
    a 400, 429 or 503 spends no CPU on its grammar and takes no room in xgrammar's cache.
    `submit()` then admits again: what is enqueued is what was predicted under the engine's lock."""
    seqs = fan_out(prompts, params, n, pieces=pieces, solo=solo, priority=run.priority)
    if not seqs:
        return seqs
    if params.structured is not None and params.structured.compiled is None:
        _admitted(run, run.engine.check_admission, seqs)
        params = structured.compile_params(params, run.config)
        seqs = fan_out(prompts, params, n, pieces=pieces, solo=solo, priority=run.priority)
    _admitted(run, run.engine.submit, seqs)
    return seqs


def _admitted(run: Run, admit: Callable[..., Prediction], seqs: list[Sequence]) -> None:
    """`admit(seqs)` (the engine's `submit` or its dry run) under the request's deadlines."""
    try:
        run.predicted = admit(seqs, max_ttft_s=run.max_ttft_s, max_total_s=run.timeout_s)
    except WaitTooLong as exc:
        run.predicted = exc.prediction
        raise


def fan_out(
    prompts: list[str],
    params: SamplingParams,
    n: int = 1,
    *,
    pieces: queue.SimpleQueue | None = None,
    solo=False,
    priority: Priority = Priority.INTERACTIVE,
) -> list[Sequence]:
    """n sequences per prompt, grouped per prompt in order (prompt 0's n, then prompt 1's...).
    With a seed, the i-th of a prompt's n gets seed + i, as vLLM does for its own n: n draws
    that differ, each reproducible. `pieces`: the queue a streamed request reads; `solo`: each
    runs in a round of its own (static engine); `priority`: the request's (`Run.priority`)."""
    per_copy = [params if params.seed is None else dataclasses.replace(params, seed=params.seed + i) for i in range(n)]
    return [Sequence(prompt, p, pieces=pieces, solo=solo, priority=priority) for prompt in prompts for p in per_copy]


def complete(run: Run, prompts: list[Prompt], params: SamplingParams, n: int = 1, *, solo=False) -> list[Sequence]:
    """Run every prompt (n times each) on the run's engine and wait for all of them, or fail the request."""
    seqs = submit(run, prompts, params, n, solo=solo)
    if not seqs:
        return seqs
    deadline = time.monotonic() + run.timeout_s
    for seq in seqs:
        if not seq.done.wait(max(0.0, deadline - time.monotonic())):
            for s in seqs:  # skipped if still queued, dropped at the next step if running
                s.cancel()
            raise deadline_exceeded(run.timeout_s)
    for seq in seqs:
        if seq.error is not None:
            raise seq.error
    return seqs


class PieceQueue:
    """The one queue that streamed sequences put their pieces on, read until a deadline: one
    request's sequences (`Pieces`), or several requests' read as one (the race page's feed).
    `close()` cancels every sequence submitted through it that still runs."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.seqs: list[Sequence] = []

    def submit(self, run: Run, prompts: list[Prompt], params: SamplingParams, n: int = 1) -> list[Sequence]:
        """`submit()` with this queue for their pieces; what it refuses raises, and adds nothing."""
        seqs = submit(run, prompts, params, n, pieces=self._queue)
        self.seqs.extend(seqs)
        return seqs

    def next(self, deadline: float, most_s: float | None = None) -> tuple[Sequence, str | None] | None:
        """The next `(sequence, text)`, or `(sequence, None)` at its end, waiting until `deadline`
        (time.monotonic), or for `most_s` if that ends sooner; None if nothing came by then."""
        wait_s = max(0.0, deadline - time.monotonic())
        try:
            return self._queue.get(timeout=wait_s if most_s is None else min(most_s, wait_s))
        except queue.Empty:
            return None

    def close(self) -> None:
        for seq in self.seqs:  # a no-op for sequences that already ended
            seq.cancel()


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

    def __init__(self, run: Run, prompts: list[Prompt], params: SamplingParams, n: int = 1, *, until_entered=False):
        """`until_entered`: answer as soon as the (first) sequence enters its round or step, not at
        its first piece, so that a details event can go first; an error before that point still
        raises here."""
        self._pieces = PieceQueue()
        self.seqs = self._pieces.submit(run, prompts, params, n)
        self._deadline = time.monotonic() + run.timeout_s
        self._timeout_error = deadline_exceeded(run.timeout_s)
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
        piece = self._pieces.next(self._deadline)
        if piece is None:
            self.close()
            raise self._timeout_error
        return piece

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
        self._pieces.close()
