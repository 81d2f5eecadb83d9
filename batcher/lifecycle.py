"""Lifecycle: one engine's state from start to stop, every transition under one lock.

    disabled                                         (VLLM_ENABLED off; final)
    loading -> [compiling ->] ready | failed         (the engine thread, as its start moves on;
                                                      failed: the load raised, `failed_to_start`)
    ready -> failed                                  (die(): the engine thread died or stalled; final)
    any of those -> stopped                          (stop(); final: nothing moves it back)
    draining: from begin_drain() on, no new work; what is held goes on (any state but stopped)

Admission holds the lock from the availability check to the enqueue, and the drain takes its
snapshot under it, so a sequence is either refused or counted in `held_at_drain`; the engine
thread's `advance()` after a `stop()` (a load that outlived the join) changes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

from batcher.errors import NotReady, ShuttingDown

log = logging.getLogger(__name__)

START = ("loading", "compiling")  # the start phases, before ready | failed


class Lifecycle:
    def __init__(self, name: str, *, enabled: bool = True, why_disabled: str = ""):
        self.name = name
        # Reentrant: begin_drain runs in a signal handler, which may interrupt its own thread.
        self.lock = threading.RLock()
        self.phase = "loading" if enabled else "disabled"  # the start's progress, kept after stop
        self.phase_seconds: dict[str, float] = {}
        self.error: str | None = None if enabled else why_disabled
        self.stopped = False
        self.draining = False
        self.held_at_drain = 0  # sequences queued or taken when the drain began
        self.abandoned = 0  # sequences that stop() answered 503 instead of finishing
        self.died = False  # failed after it was ready (die()), not at its start
        self._phase_started = time.perf_counter()
        # the events other threads wait on, each set by one transition below
        self.settled = threading.Event()  # ready, failed, stopped or disabled: wait_ready returns
        self.stopping = threading.Event()  # the engine thread's loop ends
        self.drained = threading.Event()  # draining, and nothing is queued or taken
        if not enabled:
            self.settled.set()

    @property
    def status(self) -> str:
        """loading (compiling too) | ready | failed | stopped | disabled."""
        if self.stopped and self.phase in (*START, "ready"):
            return "stopped"
        return "loading" if self.phase == "compiling" else self.phase

    @property
    def ready(self) -> bool:
        return self.phase == "ready" and not self.stopped

    @property
    def failed_to_start(self) -> bool:
        """Failed at its start (the load raised), not after it was ready: a fresh process may
        fail the same way, so gunicorn's master counts these (deploy/starts.py)."""
        return self.phase == "failed" and not self.died

    # --- the engine thread ---------------------------------------------------------------
    def begin_loading(self) -> None:
        """The engine thread starts: the loading phase counts from now."""
        self._phase_started = time.perf_counter()

    def advance(self, phase: str, error: str | None = None) -> bool:
        """Move the start on (compiling, ready, failed); False, and nothing changes, once stopped."""
        with self.lock:
            if self.stopped or self.phase not in START:
                return False
            now = time.perf_counter()
            self.phase_seconds[self.phase] = self.phase_seconds.get(self.phase, 0.0) + now - self._phase_started
            self.phase, self._phase_started = phase, now
            if phase in ("ready", "failed"):
                self.error = error
                self.settled.set()
            return True

    def die(self, error: str) -> bool:
        """Ready -> failed: the engine thread died or made no progress. Final; a drain waiting on
        it ends at once. False, and nothing changes, unless it was ready (a second death, a stop)."""
        with self.lock:
            if self.stopped or self.phase != "ready":
                return False
            self.phase, self.error, self.died = "failed", error, True
            self.drained.set()
            return True

    def note_drained(self, inflight: Callable[[], int]) -> None:
        """Between rounds or steps: draining, and nothing is queued or taken."""
        if self.draining and inflight() == 0:
            self.drained.set()

    def abandon(self, count: int = 1) -> None:
        with self.lock:
            self.abandoned += count

    # --- request threads -----------------------------------------------------------------
    def check_available(self) -> None:
        """Raise what an admission would raise now: ShuttingDown or NotReady."""
        if self.stopped or self.draining:
            raise ShuttingDown(f"the {self.name} engine is shutting down")
        if not self.ready:
            reason = f": {self.error}" if self.error else ""
            raise NotReady(f"the {self.name} engine is not ready ({self.status}){reason}")

    @contextlib.contextmanager
    def admitting(self) -> Iterator[None]:
        """Check availability and enqueue (the body) as one step: a drain or stop begins before
        the check or after the enqueue, never in between."""
        with self.lock:
            self.check_available()
            yield

    def begin_drain(self, inflight: Callable[[], int]) -> bool:
        """Refuse new work from now on; counts what is held. True the first time."""
        with self.lock:
            if self.draining or self.stopped:
                return False
            self.held_at_drain = inflight()
            self.draining = True
            return True

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            self.stopping.set()
            self.settled.set()
