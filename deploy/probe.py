"""The probe server: GET /health, /livez and /metrics on PROBE_PORT, answered by a small process of
its own from what the gunicorn worker last published (service/ops/beacon.py writes it into a folder).

Why a process: the worker's own routes share one GIL with the engine threads, vLLM's scheduler
and every stream's writer. With CPU hogs beside it, a flood made the worker's /health take
seconds (docs/performance.md#soak), and a liveness probe that waits that long restarts a busy,
healthy pod. Here a probe reads one small file and answers; the worker's GIL is never waited for.
What it cannot know, it says: no state yet is "starting", a state older than STALE_S is
"unresponsive" (the worker stopped publishing: stuck, or gone), metrics older than STALE_S are a
503 too (a frozen worker's last queue length must not steer an autoscaler), and /livez fails
past LIVE_STALE_S, or while the worker's state names a failed engine (it leaves: crash-only).

gunicorn's master starts it (gunicorn.conf.py: it binds the socket, so a port in use stops the
start with gunicorn's own error) and stops it; it also leaves by itself when the master is gone.
Standard library only: it starts in a blink and loads no torch.

    python -m deploy.probe --fd N --dir FOLDER --parent PID   (N: a listening socket it inherits)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HEALTH, METRICS = "health.json", "metrics.txt"  # the files service/ops/beacon.py writes
# The worker writes its state 4 times a second and its metrics once (service/ops/beacon.py). Older
# than this, /health says "unresponsive" (503): a balancer stops sending work to a worker that
# cannot even write a file; and /metrics is a 503, not the last numbers it wrote.
STALE_S = 10.0
# Older than this, /livez fails: a worker silent for a minute is stuck (a fresh one publishes
# within seconds of its fork: service/ops/beacon.py starts before the app loads).
LIVE_STALE_S = 60.0
# Its niceness, where the process may raise its priority (CAP_SYS_NICE, e.g. as root): it uses
# next to no CPU, and a probe should not wait behind the engines' threads or a noisy neighbour for
# its turn on a core (docs/performance.md#soak: the probes' niceness, measured beside CPU hogs).
# Elsewhere (a container's unprivileged user) it stays at its parent's.
NICE = -10
IDLE_S = 5.0  # a kubelet's probe or a scrape sends its request at once
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus' text format


def health(folder: Path, now: float) -> tuple[int, dict]:
    """The status code and body of /health from the last published state, with its age."""
    try:
        published = json.loads((folder / HEALTH).read_bytes())
    except FileNotFoundError:
        return 503, {"status": "starting", "error": "the worker has not published its state yet"}
    except (OSError, ValueError) as exc:  # never half a file (an atomic rename), but say so if it is
        return 503, {"status": "unresponsive", "error": f"unreadable state: {exc}"}
    age = now - published["at"]
    body = {**published["body"], "published_s_ago": round(age, 2)}
    if age > STALE_S:
        why = f"the worker (pid {published.get('pid')}) has published nothing for {age:.0f} s"
        return 503, {"status": "unresponsive", "error": why, "last": body}
    return published["code"], body


def livez(folder: Path, now: float) -> tuple[int, str]:
    """200 unless the worker's last state is older than LIVE_STALE_S or names a failed engine (its
    load raised, or it died: the worker leaves, and a liveness probe that still finds it so
    restarts the container). No state at all is a start (the orchestrator's startup probe judges
    that), not a stuck worker; a drain or a load is no failure either."""
    try:
        published = json.loads((folder / HEALTH).read_bytes())
        age = now - published["at"]
    except FileNotFoundError:
        return 200, "starting\n"
    except (OSError, ValueError, KeyError) as exc:
        return 503, f"unreadable state: {exc}\n"
    if age > LIVE_STALE_S:
        return 503, f"the worker has published nothing for {age:.0f} s\n"
    for name, engine in published.get("body", {}).get("engines", {}).items():
        if engine.get("status") == "failed":
            return 503, f"the {name} engine failed ({engine.get('error')}): its worker leaves\n"
    return 200, "ok\n"


def metrics(folder: Path, now: float) -> tuple[int, bytes]:
    """The worker's last metrics while they are at most STALE_S old (what /health tolerates),
    else 503. Their age is when the worker wrote them, as its state records it (`metrics_at`):
    the state is written after them, so the file is at least that new; and a state without it (a
    fresh worker still loading its app) does not vouch for the file a gone worker left."""
    try:
        written = json.loads((folder / HEALTH).read_bytes()).get("metrics_at")
    except FileNotFoundError:
        written = None
    except (OSError, ValueError) as exc:
        return 503, f"unreadable state: {exc}\n".encode()
    if written is None:
        return 503, b"no metrics published yet\n"
    if now - written > STALE_S:
        return 503, f"the worker has published no metrics for {now - written:.0f} s\n".encode()
    try:
        return 200, (folder / METRICS).read_bytes()
    except FileNotFoundError:
        return 503, b"no metrics published yet\n"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a kubelet or Prometheus may use
    # A connection's socket timeout: one that sends nothing for this long (an idle keep-alive, a
    # request sent by halves) is closed, so its thread ends. Threads are one per open connection:
    # this bounds them by the rate of connections, not by how long clients keep them.
    timeout = IDLE_S
    folder: Path  # set on the class by `serve`

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        path, now = self.path.split("?", 1)[0], time.time()
        if path == "/health":
            code, body = health(self.folder, now)
            self._send(code, "application/json", json.dumps(body).encode())
        elif path == "/livez":
            code, text = livez(self.folder, now)
            self._send(code, "text/plain; charset=utf-8", text.encode())
        elif path == "/metrics":
            code, payload = metrics(self.folder, now)
            self._send(code, METRICS_TYPE if code == 200 else "text/plain; charset=utf-8", payload)
        else:
            error = {"error": f"the probe port serves /health, /livez and /metrics, not {path}", "type": "not_found"}
            self._send(404, "application/json", json.dumps(error).encode())

    def _send(self, code: int, content_type: str, payload: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self._write(payload)

    def _write(self, payload: bytes) -> None:
        try:
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):  # the prober gave up: nothing to tell it
            pass

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's name)
        """Silent: a probe a second would drown the service's log. Errors still reach stderr."""


class Server(ThreadingHTTPServer):
    daemon_threads = True  # a prober that hangs up mid-answer holds nothing at exit
    request_queue_size = 128


def serve(sock: socket.socket, folder: Path, parent: int) -> None:
    """Answer on `sock` (already listening) until the process `parent` is no longer our parent
    (it is named, not read at our start: it may be gone by then)."""
    handler = type("Handler", (Handler,), {"folder": folder})
    server = Server(sock.getsockname()[:2], handler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock

    def orphaned() -> None:  # the master died without stopping us (a SIGKILL): leave too
        while os.getppid() == parent:
            time.sleep(1.0)
        server.shutdown()

    threading.Thread(target=orphaned, name="parent-watch", daemon=True).start()
    server.serve_forever(poll_interval=0.5)


def spawn(host: str, port: int, folder: str | os.PathLike, **popen) -> subprocess.Popen:
    """Bind host:port here (OSError if it is taken: the caller says so and stops), then start
    the probe server on it as our child, answering from `folder`, until we are gone. The socket
    is closed here once the child has it: a process forked from us later must not hold it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.create_server((host, port), family=family, backlog=128) as sock:
        fd = str(sock.fileno())
        command = [sys.executable, "-m", "deploy.probe", "--fd", fd, "--dir", str(folder), "--parent", str(os.getpid())]
        return subprocess.Popen(command, pass_fds=[sock.fileno()], **popen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fd", type=int, required=True, help="a listening TCP socket, inherited")
    parser.add_argument("--dir", type=Path, required=True, help="where service/ops/beacon.py writes")
    parser.add_argument("--parent", type=int, required=True, help="the pid to leave with (gunicorn's master)")
    args = parser.parse_args()
    try:
        os.setpriority(os.PRIO_PROCESS, 0, NICE)  # before any thread: each inherits it
    except PermissionError:
        pass  # unprivileged: the parent's niceness
    serve(socket.socket(fileno=args.fd), args.dir, args.parent)


if __name__ == "__main__":
    main()
