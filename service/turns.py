"""A worker's thread that works in turns: a turn when kicked, or every `turn_s` at the latest,
and a pool that runs what a turn hands out. The batch runner (service/jobs/runner.py) and the
background responses (service/openai/responses/background.py) are each one: the subclass says
what a turn does (`_turn`)."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)


class Turns:
    def __init__(self, name: str, turn_s: float, pool_size: int):
        self.name, self.turn_s = name, turn_s
        self._stop, self._kick = threading.Event(), threading.Event()
        self._turned = threading.Condition()  # notified after every turn
        self._pool = ThreadPoolExecutor(max_workers=pool_size, thread_name_prefix=f"{name}-work")
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def kick(self) -> None:
        """Take a turn now (new work, or work that ended)."""
        self._kick.set()

    def halt(self) -> None:
        """No new work from now on (safe in a signal handler); what runs ends with the engines'
        drain, and what it leaves is handed back for another worker."""
        self._stop.set()
        self._kick.set()

    def stop(self, timeout: float = 30.0) -> None:
        self.halt()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _turn(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._turn()
            except Exception:  # the database away for a moment: the next turn tries again
                log.exception("%s: a turn failed", self.name)
            with self._turned:
                self._turned.notify_all()
            self._kick.wait(self.turn_s)
            self._kick.clear()
