"""The one model thread of static batching: take a batch, run one round, resolve, forever.

Request threads call `submit()` and wait on each sequence's `done` event; only this thread
touches the model. A round takes what is waiting *now* (up to `batch_size`), whichever request
it came from, so request boundaries do not matter: (A,B) and (C,D,E) run as [A,B,C,D] and [E].
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from batcher.errors import NotReady, RoundFailed, ShuttingDown
from batcher.metrics import Metrics
from batcher.runner import Runner, set_torch_threads
from batcher.sequence import Sequence
from batcher.workload import Workload

log = logging.getLogger(__name__)


class ModelWorker:
    name = "static"

    def __init__(
        self,
        load_runner: Callable[[], Runner],
        *,
        batch_size: int = 4,
        batch_wait_ms: float = 0.0,
        max_queue: int = 256,
        torch_threads: int = 0,
        model_lock: threading.Lock | None = None,
        metrics: Metrics | None = None,
    ):
        self._load_runner = load_runner
        self.batch_size = batch_size
        self.batch_wait_s = batch_wait_ms / 1000
        self.torch_threads = torch_threads
        # Held around each round; see VLLMWorker: its compiler patches torch process-wide.
        self.model_lock = model_lock or threading.Lock()
        self.workload = Workload(max_queue)
        self.metrics = metrics or Metrics()
        self.metrics.queue_depth.set_function(self.workload.qsize)
        self.metrics.inflight.set_function(lambda: len(self.workload.live()))
        self.runner: Runner | None = None
        self.status = "loading"  # loading -> ready | failed; -> stopped
        self.error: str | None = None
        self.rounds = 0
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._running: list[Sequence] = []
        self._thread = threading.Thread(target=self._run, name="static-model-thread", daemon=True)

    # --- request threads -----------------------------------------------------------------
    def start(self) -> ModelWorker:
        self._thread.start()
        return self

    def wait_ready(self, timeout: float | None = None) -> bool:
        self._ready.wait(timeout)
        return self.status == "ready"

    def submit(self, seqs: list[Sequence]) -> None:
        """Enqueue all of `seqs` or none (QueueFull); the caller waits on each `seq.done`."""
        if self._stopping.is_set():
            raise ShuttingDown("the static engine is shutting down")
        if self.status != "ready":
            reason = f": {self.error}" if self.error else ""
            raise NotReady(f"the static engine is not ready ({self.status}){reason}")
        self.workload.put_all(seqs)
        self.metrics.prompts.labels(self.name).inc(len(seqs))

    def stop(self, timeout: float = 30.0) -> None:
        """Take no more work, abandon the running round at its next step, fail what waits (503)."""
        self._stopping.set()
        for seq in list(self._running):
            seq.cancel()
        self.workload.wake()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.status = "stopped"

    def health(self) -> dict:
        return {
            "status": self.status,
            "error": self.error,
            "rounds": self.rounds,
            "queued": self.workload.qsize(),
            "inflight": len(self.workload.live()),
        }

    # --- the model thread ----------------------------------------------------------------
    def _run(self) -> None:
        try:
            self.runner = self._load_runner()
            self.status = "ready"
        except Exception as exc:  # the service stays up and answers 503 with the reason
            log.exception("static engine failed to load")
            self.status, self.error = "failed", f"{type(exc).__name__}: {exc}"
            return
        finally:
            self._ready.set()
        while not self._stopping.is_set():
            batch = self.workload.next_batch(self.batch_size, self.batch_wait_s)
            if batch:
                self._run_round(batch)
        for seq in self.workload.drain():
            seq.fail(ShuttingDown("the static engine shut down before this prompt ran"))
            self.workload.release(seq)

    def _run_round(self, batch: list[Sequence]) -> None:
        self.rounds += 1
        round_no, started = self.rounds, time.perf_counter()
        self._running = batch
        shape = None
        # Every round: an idle vLLM engine in this process may have changed torch's thread count.
        set_torch_threads(self.torch_threads)
        try:
            inputs = self.runner.encode([s.prompt for s in batch])
            shape = inputs["input_ids"].shape  # [B, S]
            with self.model_lock:
                for seq in batch:
                    seq.start(round_no, len(batch), tuple(shape))
                results = self.runner.generate(batch, inputs)
            if len(results) != len(batch):
                raise RuntimeError(f"round returned {len(results)} results for {len(batch)} sequences")
        except Exception as exc:  # one bad round fails its own sequences; the thread lives on
            log.exception("round %d failed: %s sequences=%s", round_no, shape, [s.id for s in batch])
            for seq in batch:
                seq.fail(RoundFailed(f"round {round_no} failed: {type(exc).__name__}: {exc}"))
            self.metrics.rounds.labels("failed").inc()
        else:
            for seq in batch:  # hand each result back by sequence id
                text, reason = results[seq.id]
                if reason == "cancelled" and self._stopping.is_set():
                    seq.fail(ShuttingDown("the static engine shut down while this prompt ran"))
                else:
                    seq.finish(text, reason)
                self.metrics.generated_tokens.labels(self.name).inc(len(seq.token_ids))
            self.metrics.rounds.labels("ok").inc()
        finally:
            self._running = []
            for seq in batch:
                self.workload.release(seq)
            elapsed = time.perf_counter() - started
            self.metrics.batch_size.observe(len(batch))
            self.metrics.round_seconds.observe(elapsed)
        log.info(
            "round %d: Batch input shape: %s sequences=%s %.3fs",
            round_no,
            shape,
            [s.id for s in batch],
            elapsed,
        )
