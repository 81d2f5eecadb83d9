"""`make serve` as a user runs it, for the tests that need the service at this machine's defaults:
nginx on a free loopback port in front of one gunicorn on the next, under supervisord (without
nginx, plain gunicorn on the port: deploy/cluster.py). Started in its own session; `stop()` is
the user's Ctrl-C, a SIGTERM to the whole group, and a SIGKILL to it only if that does not end it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import requests

from deploy.server import ROOT, free_port_run
from deploy.tools import find_tool


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return False
    return True


class MakeServe:
    def __init__(self, run_dir: Path, env: dict[str, str]):
        # nginx on port, gunicorn + 1, its probe server + 2; or, with no profile for the machine yet,
        # two gunicorns (+ 1, + 2) and their probe servers (+ 3, + 4): deploy/first_profile.py
        self.run_dir, self.port = run_dir, free_port_run(5)
        self.nginx = find_tool("nginx") is not None
        self.url = f"http://127.0.0.1:{self.port}"  # what a client calls
        self.replica_url = f"http://127.0.0.1:{self.port + 1}" if self.nginx else self.url  # gunicorn itself
        self.log_path = run_dir / "make-serve.log"  # make's, supervisord's and the replica's output
        # PROFILE_FINISH=0: a test's `make serve` starts no background measurement of compiled rows
        # (batcher/profile/finish.py), which would share the CPU with the suite and hold up the start
        env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(self.port), "SERVE_DIR": str(run_dir), **env}
        env.setdefault("PROFILE_FINISH", "0")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                ["make", "serve"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def health(self, url: str | None = None) -> dict:
        try:
            return requests.get(f"{url or self.url}/health", timeout=5).json()
        except (requests.RequestException, ValueError):
            return {}

    def engine(self, name: str) -> dict:
        """One engine's /health entry, asked of gunicorn itself (nginx may be stopping)."""
        return self.health(self.replica_url).get("engines", {}).get(name, {})

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float) -> dict:
        """Until both engines are ready through the front door; its /health."""
        deadline = time.monotonic() + timeout_s
        while True:
            engines = (health := self.health()).get("engines", {})
            if all(engines.get(name, {}).get("status") == "ready" for name in ("static", "vllm")):
                return health
            failed = [name for name, e in engines.items() if e.get("status") in ("failed", "disabled")]
            if self.proc.poll() is not None or failed or time.monotonic() > deadline:
                raise RuntimeError(f"make serve not ready ({health}):\n{self.log_text()[-3000:]}")
            time.sleep(0.5)

    def wait_switched(self, timeout_s: float) -> dict:
        """With no profile for the machine yet: until deploy/first_profile.py has measured it and
        moved nginx to the replica started with its choices, and that replica is ready; its /health."""
        deadline = time.monotonic() + timeout_s
        while "first-profile: switched" not in (log := self.log_text()):
            if self.proc.poll() is not None or "first-profile: no switch" in log or time.monotonic() > deadline:
                raise RuntimeError(f"make serve did not switch to the profile:\n{log[-3000:]}")
            time.sleep(1)
        return self.wait_ready(max(1.0, deadline - time.monotonic()))

    def stop(self, timeout_s: float = 180) -> None:
        """SIGTERM to make's whole group, as Ctrl-C sends its signal: supervisord drains and stops
        the replica, then nginx (plain gunicorn drains itself); SIGKILL if it does not end."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        deadline = time.monotonic() + timeout_s  # make may end before what it started has
        while (listening(self.port) or listening(self.port + 1)) and time.monotonic() < deadline:
            time.sleep(0.2)
