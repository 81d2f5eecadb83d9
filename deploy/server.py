"""The real service under gunicorn on a free loopback port: one launcher and one /health poller,
for bench/ and the tests (beside cluster.py, the other way the service is run)."""

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
SETTLED = {"ready", "failed", "disabled", "stopped"}  # vLLM states that waiting will not change
EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10000  # below this: the ports services are commonly given (8000, 8080, 5432, ...)
# not the `random` module's shared state: pytest-randomly seeds it alike in every xdist worker
_pick = random.SystemRandom()


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_run(count: int = 1) -> int:
    """A port p with p..p+count-1 free on loopback, for a server to bind after we let go of it.

    Not the kernel's port 0: that picks from the ephemeral range, where every outbound connection
    and every other process's port-0 bind draws too, so one can take the port before the server
    binds it (a replica then loops on "Connection in use"). Below that range only another
    explicit bind competes; a random start keeps parallel test workers apart."""
    try:
        low, high = map(int, EPHEMERAL.read_text().split())
    except (OSError, ValueError):  # not Linux: below Linux's default range is below macOS's too
        low, high = 32768, 60999
    # below the range; above it where it starts too low for that; anywhere where neither fits
    spans = [(LOWEST_PORT, low - count + 1), (high + 1, 65537 - count), (1024, 65537 - count)]
    start, stop = next((a, b) for a, b in spans if a < b)
    for _ in range(200):
        base = _pick.randrange(start, stop)
        if all(_bindable(base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no run of {count} free ports outside the ephemeral range {low}-{high}")


class Server:
    """`gunicorn -c gunicorn.conf.py wsgi:app` in its own session, its output appended to
    `log_path`, with `env` on top of ours, and its probe server on the port after gunicorn's
    (`probe_url`; `env` PROBE_PORT=0: none). A context manager that stops it. With `url`: a service
    someone else started and will stop, polled the same way (nothing launched, nothing stopped)."""

    def __init__(self, log_path: Path, env: dict[str, str] | None = None, url: str | None = None):
        self.log_path, self.started, self.proc, self.probe_url = log_path, time.monotonic(), None, None
        if url:
            self.url = url.rstrip("/")
            return
        port = free_port_run(2)  # gunicorn, and its probe server (deploy/probe.py) on the next
        env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(port), "PROBE_PORT": str(port + 1), **(env or {})}
        self.url = f"http://127.0.0.1:{port}"
        if int(env["PROBE_PORT"]):
            self.probe_url = f"http://127.0.0.1:{env['PROBE_PORT']}"
        cmd = [str(Path(sys.executable).with_name("gunicorn")), "-c", "gunicorn.conf.py", "wsgi:app"]
        with open(log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def health(self) -> dict:
        try:
            return requests.get(f"{self.url}/health", timeout=5).json()
        except (requests.RequestException, ValueError):
            return {}

    def engine(self, name: str) -> dict:
        return self.health().get("engines", {}).get(name, {})

    def log_mark(self) -> int:
        """Where the log ends now: `log_text(since=mark)` is what was written after it."""
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log_text(self, since: int = 0) -> str:
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as log:
            log.seek(since)
            return log.read().decode(errors="replace")

    def wait_for(self, done: Callable[[dict], bool], timeout_s: float, what: str, every_s: float = 0.2) -> dict:
        """Poll /health until `done(body)`; the body; raises if the service exits or at the deadline."""
        deadline = time.monotonic() + timeout_s
        while not done(health := self.health()):
            if self.proc and self.proc.poll() is not None:
                raise RuntimeError(f"service exited with code {self.proc.returncode}:\n{self.log_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not after {timeout_s:g}s:\n{self.log_text()[-3000:]}")
            time.sleep(every_s)
        return health

    def wait_ready(self, timeout_s: float) -> dict:
        """Until the static engine is ready with its compiled graphs (not decoding eager while a
        child builds them: batcher/static/graphs.py) and vLLM has settled; the last body. A vLLM
        still loading or graphs still building at the deadline are the caller's to judge; a static
        engine that failed raises."""

        def ready(health: dict) -> bool:
            static, vllm = (health.get("engines", {}).get(name, {}) for name in ("static", "vllm"))
            if static.get("status") == "failed":
                raise RuntimeError(f"static engine failed: {static.get('error')}")
            return static.get("status") == "ready" and "graphs" not in static and vllm.get("status") in SETTLED

        try:
            return self.wait_for(ready, timeout_s, "service ready", every_s=0.5)
        except TimeoutError:
            if self.engine("static").get("status") != "ready":
                raise
            return self.health()

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM (gunicorn's graceful stop); SIGKILL to the whole group if it lingers."""
        if self.proc is None:  # not ours
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode
