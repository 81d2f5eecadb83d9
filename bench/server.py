"""Start the real service under gunicorn, wait for its engines, read its memory, stop it."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
SETTLED = {"ready", "failed", "disabled", "stopped"}  # vLLM states that will not change by waiting


@dataclass
class Server:
    url: str
    proc: subprocess.Popen | None = None  # None: a service we did not start (--url)
    log_path: Path | None = None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _gunicorn() -> str:
    local = Path(sys.executable).parent / "gunicorn"
    return str(local) if local.exists() else (shutil.which("gunicorn") or "gunicorn")


def start(env: dict[str, str], log_path: Path) -> Server:
    """gunicorn on a free loopback port, in its own process group; output appended to `log_path`."""
    port = _free_port()
    full_env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(port), **env}
    with open(log_path, "a") as log:
        log.write(f"\n=== bench: starting service on port {port} with {env}\n")
        log.flush()
        proc = subprocess.Popen(
            [_gunicorn(), "-c", "gunicorn.conf.py", "wsgi:app"],
            cwd=ROOT,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Server(f"http://127.0.0.1:{port}", proc, log_path)


def _tail(path: Path | None, lines: int = 15) -> str:
    if path is None or not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def wait_ready(server: Server, timeout_s: float) -> dict:
    """Poll /health until static is ready and vLLM has settled (ready/failed/disabled), or the
    deadline passes. Returns the last health body; a still-loading vLLM at the deadline is the
    caller's to report. Raises if the static engine never came up or the service died."""
    deadline = time.monotonic() + timeout_s
    health: dict = {}
    while time.monotonic() < deadline:
        if server.proc is not None and server.proc.poll() is not None:
            raise RuntimeError(f"service exited with code {server.proc.returncode}:\n{_tail(server.log_path)}")
        try:
            health = requests.get(server.url + "/health", timeout=5).json()
        except (requests.RequestException, ValueError):
            health = {}
        engines = health.get("engines", {})
        static = engines.get("static", {})
        if static.get("status") == "failed":
            raise RuntimeError(f"static engine failed: {static.get('error')}")
        if static.get("status") == "ready" and engines.get("vllm", {}).get("status") in SETTLED:
            return health
        time.sleep(1.0)
    if health.get("engines", {}).get("static", {}).get("status") == "ready":
        return health
    raise TimeoutError(f"service not ready after {timeout_s:g}s:\n{_tail(server.log_path)}")


def stop(server: Server, timeout_s: float = 45.0) -> None:
    """SIGTERM the master (graceful), then SIGKILL the whole process group if it lingers."""
    proc = server.proc
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def worker_pid(master_pid: int) -> int | None:
    """The gunicorn worker: the child of the master we started."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == master_pid:
            return int(stat.parent.name)
    return None


def memory(server: Server) -> dict:
    """Peak (VmHWM) and current (VmRSS) resident memory of the worker, in GiB."""
    pid = worker_pid(server.proc.pid) if server.proc is not None else None
    if pid is None:
        return {"worker_pid": None}
    status = Path(f"/proc/{pid}/status").read_text()
    kib = {key: int(re.search(rf"{key}:\s+(\d+)", status).group(1)) for key in ("VmHWM", "VmRSS")}
    return {"worker_pid": pid, "peak_gib": kib["VmHWM"] / 2**20, "rss_gib": kib["VmRSS"] / 2**20}
