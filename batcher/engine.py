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
        # start phase: loading -> [compiling ->] ready | failed; seconds spent in each
        self.phase = "loading" if enabled else "disabled"
        self.phase_seconds: dict[str, float] = {}
        self._phase_started = time.perf_counter()
        self.vocab_size: int | None = None  # set by _load(): token ids a request may name
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._draining = threading.Event()  # SIGTERM: no new work; what is held goes on
        self._drained = threading.Event()  # set by the engine thread: nothing queued or running
        self.held_at_drain = 0  # sequences queued or running when the drain began
        self.abandoned = 0  # sequences that stop() answered 503 instead of finishing
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

    def check_available(self) -> None:
        """Raise what `submit()` would raise for any request: ShuttingDown or NotReady."""
        if self._stopping.is_set() or self._draining.is_set():
            raise ShuttingDown(f"the {self.name} engine is shutting down")
        if self.status != "ready":
            reason = f": {self.error}" if self.error else ""
            raise NotReady(f"the {self.name} engine is not ready ({self.status}){reason}")

    def submit(self, seqs: list[Sequence]) -> None:
        """Enqueue all of `seqs` or none (QueueFull); the caller waits on each `seq.done`."""
        self.check_available()
        self._check_token_ids(seqs)
        self.workload.put_all(seqs)
        self.metrics.prompts.labels(self.name).inc(len(seqs))

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def begin_drain(self) -> None:
        """Refuse new work (ShuttingDown), let what is queued or running finish. Non-blocking and
        safe in a signal handler: it only sets events and wakes the engine thread."""
        if not self._draining.is_set():
            self.held_at_drain = self.inflight()
            self._draining.set()
        self.workload.wake()  # an idle engine thread looks again and finds itself drained

    def wait_drained(self, timeout: float | None) -> bool:
        """True once nothing is queued or running (at once for an engine that is not ready)."""
        return self.status != "ready" or self._drained.wait(timeout)

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

    def running(self) -> int:
        """Sequences the engine has taken from its queue and not yet resolved."""
        return 0

    def inflight(self) -> int:
        """Sequences queued or running: the queue's size and the engine's own running set."""
        return self.workload.qsize() + self.running()

    def health(self) -> dict:
        return {
            "status": self.status,
            "error": self.error,
            "load_seconds": self.load_seconds,
            "phase": self.phase,
            "phase_seconds": {k: round(v, 2) for k, v in self.phase_seconds.items()},
            "queued": self.workload.qsize(),
        }

    # --- the engine thread ---------------------------------------------------------------
    def _enter_phase(self, phase: str) -> None:
        """Called from the engine thread as its start moves on (loading -> compiling -> ready)."""
        now = time.perf_counter()
        self.phase_seconds[self.phase] = self.phase_seconds.get(self.phase, 0.0) + now - self._phase_started
        self.phase, self._phase_started = phase, now
        if phase not in ("ready", "failed"):
            log.info("%s engine: %s", self.name, phase)

    def _main(self) -> None:
        started = self._phase_started = time.perf_counter()
        try:
            self._load()
            self.load_seconds = time.perf_counter() - started
            self._enter_phase("ready")
            self.status = "ready"
            log.info("%s engine ready in %.1fs %s", self.name, self.load_seconds, self.phase_seconds)
        except Exception as exc:  # the service stays up and answers 503 with the reason
            log.exception("%s engine failed to start", self.name)
            self._enter_phase("failed")
            self.status, self.error = "failed", f"{type(exc).__name__}: {exc}"
            return
        finally:
            self._ready.set()
        self._serve()

    def _note_if_drained(self, running: int) -> None:
        """Engine thread, between rounds or steps: draining, and nothing waits or runs."""
        if self._draining.is_set() and running == 0 and self.workload.qsize() == 0:
            self._drained.set()

    def _fail_waiting(self, message: str) -> None:
        for seq in self.workload.drain():
            self.abandoned += 1
            seq.fail(ShuttingDown(message))

    def _load(self) -> None:
        raise NotImplementedError

    def _serve(self) -> None:
        raise NotImplementedError

    def _abandon(self) -> None:
        pass
