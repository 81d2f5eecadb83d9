"""What both engines share: one thread that owns a model, an inbox, a status, and the request
threads' side of it (submit all or nothing, wait until ready, stop)."""

from __future__ import annotations

import logging
import threading
import time

from batcher.errors import InvalidParams, NotReady, ShuttingDown
from batcher.metrics import Metrics
from batcher.sequence import Sequence
from batcher.workload import Workload

log = logging.getLogger(__name__)


class EngineThread:
    """Subclasses give `_load()` (build the model, in the engine's own thread), `_serve()` (the
    loop, until `self._stopping` is set) and may give `_abandon()` (called by `stop()`)."""

    name = "engine"

    def __init__(self, *, max_queue: int, metrics: Metrics | None, enabled: bool = True, why_disabled: str = ""):
        self.workload = Workload(max_queue)
        self.metrics = metrics or Metrics()
        self.status = "loading" if enabled else "disabled"  # loading -> ready | failed; -> stopped
        self.error: str | None = None if enabled else why_disabled
        self.load_seconds: float | None = None
        self.vocab_size: int | None = None  # set by _load(): token ids a request may name
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"{self.name}-engine-thread", daemon=True)
        if not enabled:
            self._ready.set()

    # --- request threads -----------------------------------------------------------------
    def start(self):
        if self.status == "loading":
            self._thread.start()
        return self

    def wait_ready(self, timeout: float | None = None) -> bool:
        self._ready.wait(timeout)
        return self.status == "ready"

    def submit(self, seqs: list[Sequence]) -> None:
        """Enqueue all of `seqs` or none (QueueFull); the caller waits on each `seq.done`."""
        if self._stopping.is_set():
            raise ShuttingDown(f"the {self.name} engine is shutting down")
        if self.status != "ready":
            reason = f": {self.error}" if self.error else ""
            raise NotReady(f"the {self.name} engine is not ready ({self.status}){reason}")
        self._check_token_ids(seqs)
        self.workload.put_all(seqs)
        self.metrics.prompts.labels(self.name).inc(len(seqs))

    def _check_token_ids(self, seqs: list[Sequence]) -> None:
        """Token ids only the loaded model can judge; refused before anything is enqueued."""
        if self.vocab_size is None:
            return
        for seq in seqs:
            named = {"logit_bias": [t for t, _ in seq.params.logit_bias], "stop_token_ids": seq.params.stop_token_ids}
            for param, ids in named.items():
                bad = [t for t in ids if t >= self.vocab_size]
                if bad:
                    message = f"'{param}' names token id {bad[0]}, outside 0..{self.vocab_size - 1}"
                    raise InvalidParams(message, param=param)

    def stop(self, timeout: float = 30.0) -> None:
        """Take no more work, abandon what runs, fail what waits (503), join the thread.
        With timeout 0 it only starts the shutdown (safe in a signal handler)."""
        self._stopping.set()
        self._abandon()
        self.workload.wake()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self.status in ("ready", "loading"):
            self.status = "stopped"

    def health(self) -> dict:
        return {
            "status": self.status,
            "error": self.error,
            "load_seconds": self.load_seconds,
            "queued": self.workload.qsize(),
        }

    # --- the engine thread ---------------------------------------------------------------
    def _main(self) -> None:
        started = time.perf_counter()
        try:
            self._load()
            self.load_seconds = time.perf_counter() - started
            self.status = "ready"
            log.info("%s engine ready in %.1fs", self.name, self.load_seconds)
        except Exception as exc:  # the service stays up and answers 503 with the reason
            log.exception("%s engine failed to start", self.name)
            self.status, self.error = "failed", f"{type(exc).__name__}: {exc}"
            return
        finally:
            self._ready.set()
        self._serve()

    def _fail_waiting(self, message: str) -> None:
        for seq in self.workload.drain():
            self.workload.release(seq)
            seq.fail(ShuttingDown(message))

    def _load(self) -> None:
        raise NotImplementedError

    def _serve(self) -> None:
        raise NotImplementedError

    def _abandon(self) -> None:
        pass
