"""The parent's side of the children: one `child.py --serve` process per engine, kept across that
engine's candidates (a process start and its imports cost more here than building an engine),
each candidate given a cap in seconds; one that overruns it is killed with its process, recorded
with what it had measured, and the next candidate of that engine gets a fresh process.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time

from batcher.profile.child import ENV, ROOT


class Child:
    """One engine's serving child: `send` a candidate, read its `event`s under a deadline."""

    def __init__(self, engine: str, log, cache: str, device: str = "cpu"):
        read, write = os.pipe()
        cmd = [sys.executable, "-m", "batcher.profile.child", "--serve", engine, str(write), cache, device]
        log.flush()
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env={**os.environ, **ENV}, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
            pass_fds=(write,), text=True, start_new_session=True,  # its own group: a kill takes its workers too
        )  # fmt: skip
        os.close(write)
        self.fd, self.pending, self.ready = read, b"", False
        self.selector = selectors.DefaultSelector()
        self.selector.register(read, selectors.EVENT_READ)

    def send(self, spec: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(spec) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:  # it died: `event` reads its exit
            pass

    def event(self, deadline: float) -> dict | None:
        """The next event, or None past `deadline` (time.monotonic()); {"event": "exit"} if the
        child died."""
        while b"\n" not in self.pending:
            wait = deadline - time.monotonic()
            if wait <= 0 or not self.selector.select(timeout=wait):
                return None
            data = os.read(self.fd, 65536)
            if not data:
                return {"event": "exit", "returncode": self.proc.wait()}
            self.pending += data
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def close(self, kill: bool = False) -> None:
        """Ends the child: at once (`kill`), or by closing its stdin (it finishes its loop)."""
        if not kill:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kill = True
        if kill:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.selector.close()
        os.close(self.fd)


class Children:
    """Every engine's child, started on its first candidate; `measure` one candidate in it."""

    def __init__(self, log, cache: str):
        self.log, self.cache, self.alive, self.base_mib = log, cache, {}, 0

    def spawn(self, engines) -> None:
        """Every engine's child at once, before any candidate runs: their imports (one core
        each, mostly) go side by side, and never beside a candidate's timed runs (`ready`)."""
        for engine in engines:
            if engine not in self.alive:
                self.alive[engine] = Child(engine, self.log, self.cache)

    def ready(self, engines, deadline: float) -> None:
        for engine in engines:
            self._ready(engine, deadline)

    def _ready(self, engine: str, deadline: float) -> bool:
        """Whether `engine`'s child (started now if need be) finished its imports by `deadline`;
        one that did not is killed."""
        if engine not in self.alive and time.monotonic() >= deadline:
            return False  # no time left to start one
        self.spawn([engine])
        child = self.alive[engine]
        if not child.ready:
            event = child.event(deadline)
            child.ready = event is not None and event["event"] == "ready"
            if child.ready:  # its imports: the larger child's (vLLM's) the worker's base
                self.base_mib = max(self.base_mib, event.get("memory_mib", 0))
            if not child.ready:
                self.drop(engine)
        return child.ready

    def measure(self, engine: str, spec: dict, cap_s: float, deadline: float) -> dict:
        """The candidate's events merged into one dict with its "status" and "seconds"; the
        child's start (imports) counts against `deadline` (the budget's end), not against the
        cap, which starts when the child is ready and is at most what the budget has left."""
        if not self._ready(engine, deadline):
            return {"status": f"timed out: the {engine} child's imports did not finish within the budget"}
        child = self.alive[engine]
        started = time.monotonic()
        cap_s = min(cap_s, deadline - started)
        child.send({**spec, "cap_s": cap_s})
        merged: dict = {}
        while (event := child.event(started + cap_s)) is not None and event["event"] not in ("done", "exit"):
            merged.update(event)
        seconds = round(time.monotonic() - started)
        if event is None:
            self.drop(engine)
            merged["status"] = f"timed out after {seconds} s (its cap: {cap_s:.0f} s)"
        elif event["event"] == "exit":
            self.alive.pop(engine).close()
            merged["status"] = f"failed: the child exited ({event['returncode']})"
        else:
            merged.update(event)
        merged.pop("event", None)
        return {**merged, "seconds": seconds}

    def drop(self, engine: str) -> None:
        self.alive.pop(engine).close(kill=True)

    def close(self) -> None:
        for engine in list(self.alive):
            self.alive.pop(engine).close()
