"""The race page's feed: one engine's N prompts, sent the chosen way, as one event stream.

The feed hands the prompts to the engine through admission, as the generate routes do
(`generation.submit` under the request's `Run`: REQUEST_TIMEOUT_S, X-Max-Queue-Ms or
`max_queue_ms`; a row refused there ends with the route's own error event), and multiplexes what
comes back in the demo streams' own events (replies.py), each tagged with the prompt's `index`
and `t_ms`, milliseconds since the race began (one clock for all rows), after a `{"index", "t_ms", "sent": true}`:

- `concurrent`: N one-prompt requests, each submitted on its own, as N clients of
  /generate_stream (or /generate_vllm_stream) with `details` would send them: the round (or
  step) each entered, its tokens as they come, its end.
- `batch`: one request carrying the N prompts, as /generate (or /generate_vllm) with `details`:
  each prompt's details once the whole request has finished.

Why here and not N fetches from the page: a browser opens at most 6 HTTP/1.1 connections to one
origin (Chromium and Firefox), so 16 or 64 concurrent streams from a page would run 6 at a time
and the race would show the browser's limit, not the batchers'. The feed runs in its request's
own thread, whatever N: the N streams share one queue of pieces (generation.PieceQueue, the one
a stream reads). It ends early, with an error event on each open row, at the request deadline
and as soon as its engine drains or stops (a demo race must not hold up a drain); when it ends,
for whatever reason, it cancels what is left.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from batcher.errors import EngineError
from batcher.sampling import SamplingParams
from batcher.sequence import Sequence
from service.demo import replies
from service.errors import log_unexpected
from service.generation import PieceQueue, Run, deadline_exceeded, submit
from service.http import sse

MODES = ("concurrent", "batch")
# How often a waiting feed looks at its engine: the engines announce a drain to no waiter, and a
# look is two flags, so twice a second costs nothing and ends a race within half a second.
CHECK_S = 0.5


class RaceFeed:
    """One engine's run of `prompts`; iterate it for the SSE lines of the feed."""

    def __init__(self, run: Run, mode: str, prompts: list[str], params: SamplingParams):
        self.run, self.mode, self.prompts, self.params = run, mode, prompts, params
        self.eng, self.timeout = run.engine, run.timeout_s
        self._t0 = time.monotonic()
        self._deadline = self._t0 + self.timeout
        self._pieces = PieceQueue()  # the concurrent mode's sequences: their pieces, their cancel
        self._seqs: list[Sequence] = []  # the batch mode's request, cancelled at the end

    def _event(self, index: int, payload: dict, at: float | None = None) -> str:
        t_ms = round(((time.monotonic() if at is None else at) - self._t0) * 1000, 1)
        return sse.event({"index": index, "t_ms": t_ms, **payload})

    def _refused(self, exc: Exception) -> dict:
        payload = replies.error(exc)
        log_unexpected(exc, payload["status"])
        return payload

    def _interrupted(self) -> BaseException | None:
        """Why the feed must end now: the deadline passed, or the engine drains or stopped."""
        if time.monotonic() >= self._deadline:
            return deadline_exceeded(self.timeout)
        try:
            self.eng.check_available()
        except EngineError as exc:  # ShuttingDown, NotReady
            return exc
        return None

    def _wait_s(self) -> float:
        return max(0.0, min(CHECK_S, self._deadline - time.monotonic()))

    def __iter__(self) -> Iterator[str]:
        try:
            yield from self._batch() if self.mode == "batch" else self._concurrent()
            yield sse.event({"race_done": True})
        finally:  # a no-op for the ended; the page left or the feed ended early
            self._pieces.close()
            for seq in self._seqs:
                seq.cancel()

    def _concurrent(self) -> Iterator[str]:
        rows: dict[str, int] = {}  # sequence id -> index, while the sequence is open
        sent = []  # written after every submit, so that the N requests go in together
        for index, prompt in enumerate(self.prompts):
            sent.append(self._event(index, {"sent": True}))
            try:
                [seq] = self._pieces.submit(self.run, [prompt], self.params)
            except Exception as exc:  # refused (queue full, too long a wait, shutting down, ...): this row only
                sent.append(self._event(index, self._refused(exc)))
                continue
            rows[seq.id] = index
        yield from sent
        entered: set[str] = set()
        while rows:
            piece = self._pieces.next(self._deadline, CHECK_S)
            if piece is not None:
                seq, text = piece
                index = rows[seq.id]
                if seq.id not in entered and seq.started_at is not None:  # the details event first
                    entered.add(seq.id)
                    yield self._event(index, replies.started(seq), at=seq.started_at)
                if text is not None:
                    yield self._event(index, replies.piece(seq, text))
                else:
                    yield self._event(index, replies.ended(seq))
                    del rows[seq.id]
            stop = self._interrupted() if rows else None
            if stop is not None:
                for seq_id, index in rows.items():
                    yield self._event(index, {"sequence_id": seq_id, **replies.error(stop)})
                return

    def _batch(self) -> Iterator[str]:
        indices = range(len(self.prompts))
        sent = [self._event(index, {"sent": True}) for index in indices]
        try:
            seqs = submit(self.run, self.prompts, self.params)
        except Exception as exc:  # refused: the whole request, as /generate answers it
            refused = self._refused(exc)
            yield from sent
            yield from (self._event(index, refused) for index in indices)
            return
        self._seqs = seqs
        yield from sent
        for seq in seqs:
            while not seq.done.wait(self._wait_s()):
                stop = self._interrupted()
                if stop is not None:
                    yield from (self._event(index, replies.error(stop)) for index in indices)
                    return
        error = next((seq.error for seq in seqs if seq.error is not None), None)
        for index, seq in enumerate(seqs):  # one failed prompt fails the request, as on /generate
            yield self._event(index, replies.error(error) if error else {**replies.detail(seq), "done": True})
