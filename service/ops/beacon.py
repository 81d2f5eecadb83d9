"""The worker's side of the probe port: one thread that writes the /health reply and the metrics
into a folder, for the probe server (deploy/probe.py, a process of its own) to answer from, under
the file names its caller gives (the probe server's: gunicorn.conf.py passes them).

It writes /health's reply every HEALTH_EVERY_S and at once when told (`kick`: a drain began, an
engine died), the metrics every METRICS_EVERY_S; each file whole, by a rename. It starts at the
worker's fork, before the app loads, and says "starting" until `attach` hands it the app's
replies. The reply is the worker's own /health (service/ops/health.py `health_reply`): one body, two
servers of it. A failure to write is logged and tried again; were the thread stuck, the probe
server would see the state age and say so."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

HEALTH_EVERY_S = 0.25  # a readiness probe sees a drain or a failure at most this late (or at once: kick)
METRICS_EVERY_S = 1.0  # a scrape is at most this stale; Prometheus scrapes every 15 s or so


def write_whole(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that a reader sees the old file or the new one, never half."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_bytes(data)
    os.replace(partial, path)


def _starting() -> tuple[dict, int]:
    return {"status": "starting", "engines": {}, "error": "the worker is loading the app"}, 503


class Beacon:
    """Publishes into `folder`: the /health state as `health_file`, the metrics as `metrics_file`."""

    def __init__(self, folder: Path, health_file: str, metrics_file: str, *, clock: Callable[[], float] = time.time):
        self.folder, self._clock = Path(folder), clock
        self.health_file, self.metrics_file = health_file, metrics_file
        self._health: Callable[[], tuple[dict, int]] = _starting
        self._metrics: Callable[[], bytes] | None = None
        self._metrics_at = float("-inf")
        self._kicked, self._stopped = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe-beacon", daemon=True)

    def start(self) -> Beacon:
        self._thread.start()
        return self

    def attach(self, health: Callable[[], tuple[dict, int]], metrics: Callable[[], bytes]) -> None:
        """From now on publish the app's replies (its /health body and code, its metrics text)."""
        self._health, self._metrics = health, metrics
        self.kick()

    def kick(self) -> None:
        """Publish now, not at the next tick (safe in a signal handler: it sets an event)."""
        self._kicked.set()

    def stop(self) -> None:
        self._stopped.set()
        self._kicked.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def publish(self) -> None:
        """Write the metrics if they are due, then /health's reply with when the metrics were
        written (`metrics_at`, null before the first): the probe server judges their age by it,
        and finds the file at least that new. Metrics that fail to render or write leave their
        time as it was, and the reply is written all the same."""
        try:
            now = self._clock()
            if self._metrics is not None and now - self._metrics_at >= METRICS_EVERY_S:
                write_whole(self.folder / self.metrics_file, self._metrics())
                self._metrics_at = now
        finally:
            body, code = self._health()
            metrics_at = self._metrics_at if self._metrics_at > float("-inf") else None
            state = {"at": self._clock(), "pid": os.getpid(), "code": code, "body": body, "metrics_at": metrics_at}
            write_whole(self.folder / self.health_file, json.dumps(state).encode())

    def _run(self) -> None:
        failing = False
        while not self._stopped.is_set():
            try:
                self.publish()
                failing = False
            except Exception:  # noqa: BLE001 (logged once per spell; the probe server sees the age)
                if not failing:
                    log.exception("probe beacon: could not publish to %s; trying again", self.folder)
                failing = True
            self._kicked.wait(HEALTH_EVERY_S)
            self._kicked.clear()
