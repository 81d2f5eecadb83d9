"""The one model thread of static batching: take a batch, run one round, resolve, forever.

Request threads call `submit()` and wait on each sequence's `done` event; only this thread
touches the model. A round takes what is waiting *now* (up to `batch_size`), whichever request
it came from, so request boundaries do not matter: (A,B) and (C,D,E) run as [A,B,C,D] and [E].
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

from batcher import fence
from batcher.engine import EngineThread
from batcher.errors import RoundFailed, ShuttingDown
from batcher.metrics import Metrics
from batcher.runner import Runner, set_torch_threads
from batcher.sequence import Sequence

log = logging.getLogger(__name__)


class ModelWorker(EngineThread):
    name = "static"

    def __init__(
        self,
        load_runner: Callable[[], Runner],
        *,
        batch_size: int = 4,
        batch_wait_ms: float = 0.0,
        max_queue: int = 256,
        torch_threads: int = 0,
        metrics: Metrics | None = None,
    ):
        super().__init__(max_queue=max_queue, metrics=metrics)
        self._load_runner = load_runner
        self.batch_size = batch_size
        self.batch_wait_s = batch_wait_ms / 1000
        self.torch_threads = torch_threads
        self.metrics.queue_depth.set_function(self.workload.qsize)
        self.metrics.inflight.set_function(self.inflight)
        self.runner: Runner | None = None
        self.rounds = 0
        self._running: list[Sequence] = []

    def health(self) -> dict:
        return {**super().health(), "rounds": self.rounds, "inflight": self.inflight()}

    def running(self) -> int:
        return len(self._running)

    # --- the model thread ----------------------------------------------------------------
    def _load(self) -> None:
        # transformers sets torch's default dtype while it builds the model, as vLLM does: fenced
        with fence.static_round():
            self.runner = self._load_runner()
        self.vocab_size = self.runner.model.config.vocab_size
        if self.runner.compiles:  # STATIC_COMPILE: the first graph, before any request waits on it
            self._enter_phase("compiling")
            set_torch_threads(self.torch_threads)
            with fence.model_work(), fence.static_round():  # in fence.py's order
                seconds = self.runner.warm_up()
            log.info("static engine: decode step compiled in %.1fs", seconds)

    def _serve(self) -> None:
        while not self._stopping.is_set():
            batch = self.workload.next_batch(self.batch_size, self.batch_wait_s)
            if batch:
                self._run_round(batch)
            self._note_if_drained(running=0)
        self._fail_waiting("the static engine shut down before this prompt ran")

    def _abandon(self) -> None:
        for seq in list(self._running):  # the running round stops at its next step
            seq.cancel()

    def _run_round(self, batch: list[Sequence]) -> None:
        self.rounds += 1
        round_no, started = self.rounds, time.perf_counter()
        self._running = batch
        shape, results, error = None, None, None
        # Every round: an idle vLLM engine in this process may have changed torch's thread count.
        set_torch_threads(self.torch_threads)
        try:
            inputs = self.runner.encode([s.prompt for s in batch])
            shape = inputs["input_ids"].shape  # [B, S]
            # a round that compiles keeps vLLM from stepping meanwhile (fence.py), a rare event
            compiling = self.runner.needs_compile(inputs, max(s.params.max_tokens for s in batch))
            with fence.model_work() if compiling else contextlib.nullcontext(), fence.static_round():
                for seq in batch:
                    seq.start(round_no, len(batch), tuple(shape))
                results = self.runner.generate(batch, inputs)
            if len(results) != len(batch):
                raise RuntimeError(f"round returned {len(results)} results for {len(batch)} sequences")
        except Exception as exc:  # one bad round fails its own sequences; the thread lives on
            error = exc
            log.exception("round %d failed", round_no)
        elapsed = time.perf_counter() - started
        # logged before anyone is woken, so a client that got its answer finds the line written
        log.info("round %d: Batch input shape: %s sequences=%s %.3fs", round_no, shape, [s.id for s in batch], elapsed)
        self._running = []  # before waking any request: nothing in flight is left over
        for seq in batch:  # hand each result back by sequence id
            if error is not None:
                seq.fail(RoundFailed(f"round {round_no} failed: {type(error).__name__}: {error}"))
                continue
            text, reason = results[seq.id]
            if reason == "cancelled" and self._stopping.is_set():
                self.abandoned += 1
                seq.fail(ShuttingDown("the static engine shut down while this prompt ran"))
            else:
                seq.finish(text, reason)
            self.metrics.generated_tokens.labels(self.name).inc(len(seq.token_ids))
        self.metrics.rounds.labels("failed" if error else "ok").inc()
        self.metrics.batch_size.observe(len(batch))
        self.metrics.round_seconds.observe(elapsed)
