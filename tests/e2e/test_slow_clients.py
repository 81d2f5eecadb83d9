"""`make serve` under slow clients: 500 connections that send half a request and wait, more than
gunicorn's threads (128), while /health and /generate must still answer, and after they close.
Real make, nginx, supervisord, gunicorn and model (tests/e2e/conftest.py's `served`, which lm-eval and
the drain on Ctrl-C share; the drain test checks that its stop leaves nothing running); loopback only.
"""

from __future__ import annotations

import socket

import pytest
import requests

from tests.helpers.servers import auth

HALF_OPEN = 500
TIMEOUT_S = 300  # a bound on each call on a loaded machine, not a speed asserted
# half a request each: headers cut short, or whole headers and half the body they announce
HALVES = (
    b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: app",
    b'POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 64\r\n\r\n{"pro',
)

pytestmark = pytest.mark.slow


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
    body = {"prompts": ["The capital of France is"], "max_tokens": 4}
    r = requests.post(f"{url}/generate", json=body, headers=auth(), timeout=TIMEOUT_S)
    assert r.status_code == 200, r.text
    return r.json()


def test_half_open_connections_starve_nothing(served):
    if not served.nginx:
        pytest.skip("nginx is not installed (`make setup` installs it when run as root): plain gunicorn starves")
    url, socks = served.url, []
    try:
        for i in range(HALF_OPEN):
            sock = socket.create_connection(("127.0.0.1", served.port), timeout=30)
            sock.sendall(HALVES[i % 2])
            socks.append(sock)
        # the listen queue is first in, first out: these are accepted after every half request
        health = requests.get(f"{url}/health", timeout=TIMEOUT_S)
        assert health.status_code == 200 and health.json()["engines"]["static"]["status"] == "ready"
        assert len(generate(url)["generated_texts"]) == 1
        assert all(still_open(s) for s in socks)  # answered while all 500 were held open
    finally:
        for sock in socks:
            sock.close()
    assert requests.get(f"{url}/health", timeout=TIMEOUT_S).status_code == 200
    assert len(generate(url)["generated_texts"]) == 1
