"""`make serve` under slow clients: 500 connections that send half a request and wait, more than
gunicorn's threads (128), while /health and /generate must still answer, and after they close.
Real make, nginx, supervisord, gunicorn and model; loopback only; VLLM_ENABLED=0 to spare the CPUs.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest
import requests

from deploy.server import free_port_run
from tests.conftest import wait_until
from tests.test_cluster import healthy

ROOT = Path(__file__).resolve().parent.parent
HALF_OPEN = 500
TIMEOUT_S = 300  # a bound on each call on a loaded machine, not a speed asserted
# half a request each: headers cut short, or whole headers and half the body they announce
HALVES = (
    b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: app",
    b'POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 64\r\n\r\n{"pro',
)

pytestmark = pytest.mark.slow


@pytest.fixture
def served(tmp_path):
    """`make serve` in its own session on a free pair of ports; SIGTERM, as a user's Ctrl-C."""
    if not (shutil.which("nginx") or Path("/usr/sbin/nginx").exists()):
        pytest.skip("nginx is not installed (`make setup` installs it when run as root)")
    port = free_port_run(2)  # nginx on port, gunicorn on port + 1
    env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(port), "SERVE_DIR": str(tmp_path), "VLLM_ENABLED": "0"}
    env["CLIENT_TIMEOUT_S"] = "600"  # nginx keeps the half requests for the whole test, however slow the machine
    with open(tmp_path / "make-serve.log", "wb") as log:
        proc = subprocess.Popen(
            ["make", "serve"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: healthy(url) or proc.poll() is not None, 600, "make serve to be healthy")
        assert proc.poll() is None, (tmp_path / "make-serve.log").read_text()[-3000:]
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    stopped = (tmp_path / "supervisord.log").read_text()  # make itself ends by the SIGTERM it got
    assert "stopped: replica1 (exit status 0)" in stopped and "stopped: nginx (exit status 0)" in stopped
    assert not (tmp_path / "supervisord.pid").exists()  # supervisord stopped nginx and gunicorn and left
    assert not listening(port) and not listening(port + 1)  # neither nginx nor gunicorn is left


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return False
    return True


def still_open(sock: socket.socket) -> bool:
    """Nothing to read and not closed: the server still waits for the rest of the request."""
    sock.setblocking(False)  # a socket with a timeout would wait that long for the answer
    try:
        sock.recv(1)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False  # an answer (a 408, an error) or the end of the stream


def generate(url: str) -> dict:
    r = requests.post(
        f"{url}/generate", json={"prompts": ["The capital of France is"], "max_tokens": 4}, timeout=TIMEOUT_S
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_half_open_connections_starve_nothing(served):
    socks = []
    try:
        for i in range(HALF_OPEN):
            sock = socket.create_connection(("127.0.0.1", int(served.rsplit(":", 1)[1])), timeout=30)
            sock.sendall(HALVES[i % 2])
            socks.append(sock)
        # the listen queue is first in, first out: these are accepted after every half request
        health = requests.get(f"{served}/health", timeout=TIMEOUT_S)
        assert health.status_code == 200 and health.json()["engines"]["static"]["status"] == "ready"
        assert len(generate(served)["generated_texts"]) == 1
        assert all(still_open(s) for s in socks)  # answered while all 500 were held open
    finally:
        for sock in socks:
            sock.close()
    assert requests.get(f"{served}/health", timeout=TIMEOUT_S).status_code == 200
    assert len(generate(served)["generated_texts"]) == 1
