"""`make rolling-restart`: the replicas of a running cluster restarted one at a time, each out of
nginx's upstream while it drains and loads, and back once its /health answers 200."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from deploy.render import render
from deploy.settings import SETTINGS_FILE, Settings
from deploy.tools import require_tool


def healthy(address: str, port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}:{port}/health", timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_healthy(address: str, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not healthy(address, port):
        if time.monotonic() > deadline:
            raise SystemExit(f"replica on :{port} not healthy after {timeout_s:.0f}s; stopping the rolling restart")
        time.sleep(0.5)


def rolling_restart(run_dir: Path, health_timeout_s: float) -> dict[str, float]:
    """Restart the replicas one at a time; returns each one's seconds from out of nginx to back in.

    Each replica leaves nginx's upstream first (`down`, then a graceful reload: nginx finishes what
    it sent there), so it gets no new requests while it drains and loads; requests already on
    their way get its 503 and go to another replica. It comes back once its /health answers 200
    (the reload also clears any failures nginx counted against it)."""
    if not (run_dir / SETTINGS_FILE).exists():
        raise SystemExit(f"no cluster at {run_dir} (start one with `make cluster`, same PORT)")
    s = Settings.load(run_dir)
    supervisorctl = require_tool("supervisorctl")

    def ctl(*args: str) -> None:
        subprocess.run(
            [supervisorctl, "-c", str(s.supervisord_conf), *args],
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=s.graceful_timeout_s + 60,  # a restart waits for the drain
        )

    started, seconds = time.monotonic(), {}
    for i, port in enumerate(s.replica_ports, 1):  # never take one out while another is unhealthy
        wait_healthy(s.replica_at(i)[1], port, health_timeout_s)
    for i, port in enumerate(s.replica_ports, 1):
        t0 = time.monotonic()
        render(s, down=i)
        ctl("signal", "HUP", "nginx")
        ctl("restart", f"replicas:replica{i}")  # SIGTERM: it drains and exits 0; then it starts again
        restarted = time.monotonic() - t0
        wait_healthy(s.replica_at(i)[1], port, health_timeout_s)
        render(s)
        ctl("signal", "HUP", "nginx")
        seconds[f"replica{i}"] = time.monotonic() - t0
        print(
            f"rolling-restart: replica{i} (:{port}) drained and restarted in {restarted:.1f}s, "
            f"healthy and back in nginx after {seconds[f'replica{i}']:.1f}s",
            flush=True,
        )
    print(f"rolling-restart: {s.replicas} replicas restarted in {time.monotonic() - started:.1f}s", flush=True)
    return seconds
