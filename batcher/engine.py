"""What both engines share: one thread that owns a model, an inbox (the workload: what is queued
and what is taken), a lifecycle, and the request threads' side of it (submit all or nothing,
wait until ready, drain, stop)."""

from __future__ import annotations

import logging
import threading
import time

from batcher.errors import InvalidParams, ShuttingDown
from batcher.lifecycle import Lifecycle
from batcher.metrics import Metrics
from batcher.sequence import Sequence
from batcher.workload import Workload

log = logging.getLogger(__name__)


class EngineThread:
    """Subclasses give `_load()` (build the model, in the engine's own thread), `_serve()` (the
    loop, until `self.lifecycle.stopping` is set) and may give `_abandon()` (called by `stop()`).
    `settings`: the engine's slice of Config (batcher/settings.py)."""

    name = "engine"

    def __init__(self, settings, *, max_queue: int, metrics: Metrics | None, enabled=True, why_disabled=""):
        self.settings = settings
        self.workload = Workload(max_queue)
        self.metrics = metrics or Metrics()
        self.lifecycle = Lifecycle(self.name, enabled=enabled, why_disabled=why_disabled)
        self.load_seconds: float | None = None
        self.vocab_size: int | None = None  # set by _load(): token ids a request may name
        self._thread = threading.Thread(target=self._main, name=f"{self.name}-engine-thread", daemon=True)

    # the lifecycle's state, as the service and the tests read it
    @property
    def status(self) -> str:
        return self.lifecycle.status

    @property
    def phase(self) -> str:
        return self.lifecycle.phase

    @property
    def error(self) -> str | None:
        return self.lifecycle.error

    @property
    def draining(self) -> bool:
        return self.lifecycle.draining

    @property
    def held_at_drain(self) -> int:
        return self.lifecycle.held_at_drain

    @property
    def abandoned(self) -> int:
        return self.lifecycle.abandoned

    # --- request threads -----------------------------------------------------------------
    def start(self):
        if self.lifecycle.status == "loading" and not self._thread.is_alive():
            self._thread.start()
        return self

    def wait_ready(self, timeout: float | None = None) -> bool:
        self.lifecycle.settled.wait(timeout)
        return self.lifecycle.ready

    def check_available(self) -> None:
        """Raise what `submit()` would raise for any request: ShuttingDown or NotReady."""
        self.lifecycle.check_available()

    def submit(self, seqs: list[Sequence]) -> None:
        """Enqueue all of `seqs` or none (QueueFull); the caller waits on each `seq.done`."""
        with self.lifecycle.admitting():
            self._check_token_ids(seqs)
            self.workload.put_all(seqs)
        self.metrics.prompts.labels(self.name).inc(len(seqs))

    def begin_drain(self) -> None:
        """Refuse new work (ShuttingDown), let what is queued or taken finish. Non-blocking and
        safe in a signal handler: a short lock, and it wakes the engine thread."""
        self.lifecycle.begin_drain(self.inflight)
        self.workload.wake()  # an idle engine thread looks again and finds itself drained

    def wait_drained(self, timeout: float | None) -> bool:
        """True once nothing is queued or taken (at once for an engine that is not ready)."""
        return not self.lifecycle.ready or self.lifecycle.drained.wait(timeout)

    def _check_token_ids(self, seqs: list[Sequence]) -> None:
        """Token ids only the loaded model can judge; refused before anything is enqueued."""
        if self.vocab_size is None:
            return
        for seq in seqs:
            named = {"logit_bias": [t for t, _ in seq.params.logit_bias], "stop_token_ids": seq.params.stop_token_ids}
            if not isinstance(seq.prompt, str):
                named["prompt"] = seq.prompt
            for param, ids in named.items():
                self.check_token_ids(ids, param)

    def check_token_ids(self, ids, param: str) -> None:
        """InvalidParams naming `param` for an id the loaded model does not have (ids are >= 0:
        the parser has checked that)."""
        if self.vocab_size is None:
            return
        bad = [t for t in ids if t >= self.vocab_size]
        if bad:
            message = f"'{param}' names token id {bad[0]}, outside 0..{self.vocab_size - 1}"
            raise InvalidParams(message, param=param)

    def stop(self, timeout: float = 30.0) -> None:
        """Take no more work, abandon what is taken, fail what waits (503), join the thread.
        With timeout 0 it only starts the shutdown (safe in a signal handler)."""
        self.lifecycle.stop()
        self._abandon()
        self.workload.wake()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def running(self) -> int:
        """Sequences the engine has taken from its queue and not yet resolved."""
        return self.workload.running()

    def inflight(self) -> int:
        """Sequences queued or taken."""
        return self.workload.inflight()

    def health(self) -> dict:
        return {
            "status": self.lifecycle.status,
            "error": self.lifecycle.error,
            "load_seconds": self.load_seconds,
            "phase": self.lifecycle.phase,
            "phase_seconds": {k: round(v, 2) for k, v in self.lifecycle.phase_seconds.items()},
            "queued": self.workload.qsize(),
            "running": self.running(),
            "inflight": self.inflight(),
            "settings": self.settings.shown(),
        }

    # --- the engine thread ---------------------------------------------------------------
    def _enter_phase(self, phase: str) -> None:
        """Called from the engine thread as its start moves on (loading -> compiling)."""
        if self.lifecycle.advance(phase):
            log.info("%s engine: %s", self.name, phase)

    def _main(self) -> None:
        started = time.perf_counter()
        self.lifecycle.begin_loading()
        try:
            self._load()
        except Exception as exc:  # the service stays up and answers 503 with the reason
            log.exception("%s engine failed to start", self.name)
            self.lifecycle.advance("failed", f"{type(exc).__name__}: {exc}")
            return
        self.load_seconds = time.perf_counter() - started
        if not self.lifecycle.advance("ready"):
            log.info("%s engine loaded in %.1fs, after it was stopped", self.name, self.load_seconds)
            return
        log.info("%s engine ready in %.1fs %s", self.name, self.load_seconds, self.lifecycle.phase_seconds)
        self._serve()

    def _note_if_drained(self) -> None:
        """Engine thread, between rounds or steps."""
        self.lifecycle.note_drained(self.inflight)

    def _fail_waiting(self, message: str) -> None:
        for seq in self.workload.drain():
            self.lifecycle.abandon()
            seq.fail(ShuttingDown(message))

    def _load(self) -> None:
        raise NotImplementedError

    def _serve(self) -> None:
        raise NotImplementedError

    def _abandon(self) -> None:
        pass
