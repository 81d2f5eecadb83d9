"""Failed starts in a row: gunicorn's master counts them and, at LIMIT, stops instead of looping.

Crash-only covers a start too (batcher/engine.py): an engine whose load raised ends its worker as
a death does, and the master starts a fresh worker, which loads again. What a fresh process cures
(memory another process held, a file still being written) is cured so. What it does not (a
missing model, a setting the engine refuses) would load and fail for good, the replica never
serving and never restarted; so after LIMIT failed starts in a row the master halts, with one
line naming the engine and the error, and exits EXIT_STATUS. Its supervisor takes over with its
own backoff and shows why: a kubelet's CrashLoopBackOff, supervisord's `exitcodes`
(deploy/supervisord.conf.j2).

A worker tells the master how its start ended in a file named for its pid, in a folder the master
made before the first fork (gunicorn's `child_exit` hook is given the worker, not its exit
status): "ready" once every enabled engine is ready, which begins the count again, or the engine
that failed and its error. A worker that left before either (killed while it loaded) changes
nothing. It runs in the master, which loads no torch.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from pathlib import Path

from gunicorn.arbiter import Arbiter

LIMIT = 3  # failed starts in a row before the master stops (docs/operations.md, crash-only)
EXIT_STATUS = Arbiter.WORKER_BOOT_ERROR  # gunicorn's own "a worker could not boot": retrying is pointless


class FailedStarts:
    def __init__(self, limit: int = LIMIT):
        self.limit = limit
        self.folder: Path | None = None
        self.in_a_row = 0
        self.last: dict | None = None  # the last failure: {"engine": ..., "error": ...}

    # --- the master ------------------------------------------------------------------------
    def open(self) -> None:
        """Before the first worker is forked: each worker inherits the folder's name."""
        self.folder = Path(tempfile.mkdtemp(prefix="batcher-starts-"))

    def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def worker_left(self, pid: int) -> dict | None:
        """A worker has exited: count its start. Returns its failure, if its start failed."""
        if self.folder is None:
            return None
        path = self.folder / str(pid)
        try:
            outcome = json.loads(path.read_bytes())
        except (OSError, ValueError):  # it left before its start ended: nothing to count
            return None
        path.unlink(missing_ok=True)
        if outcome.get("ready"):
            self.in_a_row, self.last = 0, None
            return None
        self.in_a_row, self.last = self.in_a_row + 1, outcome
        return outcome

    def give_up(self) -> str | None:
        """Why the master stops rather than fork another worker (one line), or None."""
        if self.in_a_row < self.limit or self.last is None:
            return None
        error = " ".join(str(self.last["error"]).split())  # one line, whatever the exception said
        return f"the {self.last['engine']} engine failed to load {self.in_a_row} times in a row: {error}"

    # --- the worker ------------------------------------------------------------------------
    def watch(self, engines: dict) -> None:
        """In a worker, before anything else registers `when_dead` (the report is written before
        the worker leaves): report the start's end, a failed load or every enabled engine ready."""
        for engine in engines.values():
            engine.when_dead(lambda name, error, engine=engine: self._failed(engine, name, error))

        def ready() -> None:  # wait_ready: until the engine settles; a disabled one is not needed
            if all(e.wait_ready() or e.status == "disabled" for e in engines.values()):
                self._report({"ready": True})

        threading.Thread(target=ready, name="start-report", daemon=True).start()

    def _failed(self, engine, name: str, error: str) -> None:
        if engine.lifecycle.failed_to_start:  # a death after the start is not a failed start
            self._report({"engine": name, "error": error})

    def _report(self, outcome: dict) -> None:
        if self.folder is None:  # not under gunicorn.conf.py's master
            return
        path = self.folder / str(os.getpid())
        partial = path.with_name(f".{path.name}")
        partial.write_text(json.dumps(outcome))
        os.replace(partial, path)  # the master reads all of it or none
