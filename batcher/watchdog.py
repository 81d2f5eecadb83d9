"""Crash-only: an engine whose load raised, or whose thread dies (an exception its loop did not
expect) or holds work and makes no progress for `stall_s` (a step that never returns: the
watchdog's thread sees it), is failed for good. What it holds is answered 503 at once, new work
is refused naming the error, /health turns 503, and the callbacks given to `when_dead` run:
under gunicorn the worker then leaves (gunicorn.conf.py), and its supervisor starts a fresh one,
which loads again. Nothing is restarted in process: a thread stuck in a step cannot be taken
back, and a fresh process is the one state known to be good."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from batcher.errors import EngineDied
from batcher.lifecycle import Lifecycle
from batcher.workload import Workload

log = logging.getLogger(__name__)


class Watchdog:
    """One engine's death: the thread that finds a stall, the failing of what it holds, and the
    callbacks that learn of it. The engine owns one and tells it of each sign of progress."""

    def __init__(self, name: str, lifecycle: Lifecycle, workload: Workload, stall_s: float):
        self.name, self.lifecycle, self.workload, self.stall_s = name, lifecycle, workload, stall_s
        self._thread = threading.Thread(target=self._watch, name=f"{name}-watchdog", daemon=True)
        self._beat = time.monotonic()  # the engine thread's last sign of progress (`beat`)
        self._on_death: list[Callable[[str, str], None]] = []

    def start(self) -> None:
        self._thread.start()

    def when_dead(self, callback: Callable[[str, str], None]) -> None:
        """`callback(engine name, error)` runs once when the engine fails: its load raised, or it
        died after it was ready (in the thread that found it so); here, at once, if it already
        has (a load can fail before the caller gets to ask)."""
        with self.lifecycle.lock:  # the engine thread fails it under this lock, then reads the list
            if self.lifecycle.phase != "failed":
                self._on_death.append(callback)
                return
        callback(self.name, self.lifecycle.error)

    def beat(self) -> None:
        """The engine thread made progress (a turn of its loop that did work, a step, a round)."""
        self._beat = time.monotonic()

    def stalled_s(self) -> float:
        """Seconds the engine has held work without progress (0 while idle). Progress: the
        engine thread's last beat, a token of any sequence it took; the oldest queued sequence's
        arrival stands for the moment it last had nothing to do, so an engine that was idle for
        an hour is not stalled the instant a request comes."""
        taken, queued = self.workload.taken(), self.workload.queued()
        if not taken and not queued:
            return 0.0
        signs = [self._beat, *(s.last_token_at or s.started_at or s.created_at for s in taken)]
        signs += [s.created_at for s in queued[:1]]
        return max(0.0, time.monotonic() - max(signs))

    def _watch(self) -> None:
        """Fails a ready engine that holds work and makes no progress."""
        every = min(1.0, self.stall_s / 4)
        while not self.lifecycle.stopping.wait(every):
            if self.lifecycle.died:
                return
            stalled = self.stalled_s() if self.lifecycle.ready else 0.0
            if stalled > self.stall_s:
                log.error("%s engine: no progress for %.1fs with work held", self.name, stalled)
                self.die(f"no progress for {stalled:.0f}s (ENGINE_STALL_S {self.stall_s:g})")

    def die(self, error: str) -> None:
        """Failed for good after it was ready: what is held answered 503 at once, the death
        callbacks run."""
        if not self.lifecycle.die(error):
            return
        died = EngineDied(f"the {self.name} engine failed: {error}")
        held = self.workload.taken() + self.workload.drain()
        for seq in held:
            self.workload.release(seq)
            seq.fail(died)
        log.error("%s engine failed: %s; %d sequences answered 503", self.name, error, len(held))
        self.dead(error)

    def dead(self, error: str) -> None:
        """Failed for good (at its load or later): the death callbacks run, each once."""
        for callback in self._on_death:
            try:
                callback(self.name, error)
            except Exception:
                log.exception("%s engine: a death callback failed", self.name)
