"""The service as an attacker and a careless operator would try it, on a real gunicorn: each try gets
its clear answer, and the service stays healthy afterwards (nothing queued, the engine ready, an
ordinary request still answered).

On `static_server` (tests/e2e/conftest.py: the static engine alone, no API key, as a developer's
loopback default) and, for the settings, gunicorn refusing to start at all."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import MODEL, PARIS, wait_until

ROOT = Path(__file__).resolve().parents[2]
COMPLETIONS = "/static/v1/completions"


@pytest.fixture
def server(static_server):
    return static_server


def healthy(server) -> None:
    """The engine ready with nothing held, and an ordinary request answered."""
    engine = server.engine("static")
    assert engine["status"] == "ready" and engine["queued"] == 0 and engine["inflight"] == 0, engine
    r = requests.post(f"{server.url}/generate", json={"prompts": [PARIS], "max_tokens": 2}, timeout=300)
    assert r.status_code == 200 and len(r.json()["generated_texts"]) == 1, r.text


def prompts_run(server) -> float:
    """The static engine's `prompts` counter: every prompt it accepted."""
    text = requests.get(f"{server.url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "prompts_total" and sample.labels.get("engine") == "static":
                return sample.value
    return 0.0


def worker(server) -> psutil.Process:
    """gunicorn's worker: the master's child that is not the probe server."""
    children = psutil.Process(server.proc.pid).children()
    [child] = [c for c in children if "deploy.probe" not in " ".join(c.cmdline())]
    return child


# --- a web page on another origin ------------------------------------------------------------
@pytest.mark.parametrize(
    "path, content_type, body",
    [
        (COMPLETIONS, "text/plain;charset=UTF-8", {"model": MODEL, "prompt": PARIS, "max_tokens": 2}),
        ("/generate", "application/x-www-form-urlencoded", {"prompts": [PARIS], "max_tokens": 2}),
        ("/generate", "multipart/form-data; boundary=x", {"prompts": [PARIS], "max_tokens": 2}),
        ("/race", "text/plain", {"engine": "static", "prompts": [PARIS], "max_tokens": 2}),
    ],
)
def test_a_cross_site_body_is_a_415_and_runs_nothing(server, path, content_type, body):
    """The content types a browser sends cross-site without a preflight; and no CORS header lets a
    page read an answer or send JSON."""
    before = prompts_run(server)
    headers = {"Content-Type": content_type, "Origin": "https://evil.example"}
    r = requests.post(f"{server.url}{path}", data=json.dumps(body), headers=headers, timeout=60)
    assert r.status_code == 415, r.text
    error = r.json()["error"]
    if path.startswith("/static/v1"):
        assert error["code"] == "unsupported_media_type" and error["type"] == "invalid_request_error", error
    else:
        assert r.json()["type"] == "unsupported_media_type", r.json()
    assert not any(name.lower().startswith("access-control-") for name in r.headers), r.headers
    preflight = requests.options(
        f"{server.url}{COMPLETIONS}",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
        timeout=60,
    )
    assert "Access-Control-Allow-Origin" not in preflight.headers
    assert prompts_run(server) == before
    healthy(server)


# --- huge sizes and odd encodings --------------------------------------------------------------
@pytest.mark.parametrize(
    "body, param",
    [
        ({"n": 1_000_000}, "n"),
        ({"logprobs": 1_000_000}, "logprobs"),
        ({"max_tokens": 10**12}, "max_tokens"),
        ({"prompt": [PARIS] * 1000}, "prompt"),
        ({"stop": ["x"] * 10_000}, "stop"),
        ({"logit_bias": {str(i): 1 for i in range(10_000)}}, "logit_bias"),
    ],
)
def test_huge_sizes_are_refused_naming_the_field(server, body, param):
    r = requests.post(f"{server.url}{COMPLETIONS}", json={"model": MODEL, "prompt": PARIS, **body}, timeout=120)
    assert r.status_code in (400, 413), r.text[:500]
    assert param in r.json()["error"]["message"] or r.json()["error"]["param"] == param, r.text[:500]
    healthy(server)


def test_huge_top_logprobs_on_chat_are_refused_naming_the_field(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": 10**6}
    r = requests.post(f"{server.url}/static/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs", r.text
    healthy(server)


@pytest.mark.parametrize(
    "payload, content_type",
    [
        (b'{"prompts": ["\xff\xfe"]}', "application/json"),  # not UTF-8
        ('{"prompts": ["caf\u00e9"]}'.encode("latin-1"), "application/json; charset=latin-1"),
        ('{"prompts": ["Hi"]}'.encode("utf-16"), "application/json"),  # a BOM, then UTF-16
        (b'{"prompts": ["\\ud800"]}', "application/json"),  # a lone surrogate, valid JSON
        (b"\x00" * 1000, "application/json"),
    ],
)
def test_odd_encodings_are_a_400_or_read_and_never_a_500(server, payload, content_type):
    r = requests.post(f"{server.url}/generate", data=payload, headers={"Content-Type": content_type}, timeout=120)
    assert r.status_code in (200, 400), r.text[:500]
    if r.status_code == 400:
        assert r.json()["type"] in ("invalid_json", "invalid_text"), r.text
    healthy(server)


def test_a_slow_reader_holds_nothing_that_others_need(server):
    """A stream opened and never read, its socket left open: the service answers others meanwhile."""
    body = json.dumps({"prompt": "Tell me a long story", "max_tokens": 64, "ignore_eos": True}).encode()
    head = f"POST /generate_stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(head.encode() + b"\r\n\r\n" + body)
        r = requests.post(f"{server.url}/generate", json={"prompts": [PARIS], "max_tokens": 2}, timeout=300)
        assert r.status_code == 200
    wait_until(lambda: server.engine("static")["inflight"] == 0, 300, what="the unread stream to end")
    healthy(server)


# --- the probe port ----------------------------------------------------------------------------
def test_the_probe_port_serves_three_gets_and_nothing_else(server):
    for method, path in (("POST", "/health"), ("GET", "/generate"), ("GET", "/../../etc/passwd"), ("PUT", "/metrics")):
        r = requests.request(method, f"{server.probe_url}{path}", timeout=30)
        assert r.status_code in (404, 405, 501), (method, path, r.status_code)
    assert requests.get(f"{server.probe_url}/health", timeout=30).status_code == 200


def test_a_frozen_worker_is_never_reported_fresh(server):
    """SIGSTOP the worker (stuck, as a deadlock would leave it): the probe port's /health says
    unresponsive and /metrics stops answering 200 at the same age; both come back by themselves."""
    probe, frozen = server.probe_url, worker(server)
    frozen.send_signal(signal.SIGSTOP)
    try:
        wait_until(
            lambda: requests.get(f"{probe}/health", timeout=10).status_code == 503, 60, what="/health unresponsive"
        )
        assert requests.get(f"{probe}/health", timeout=10).json()["status"] == "unresponsive"
        assert requests.get(f"{probe}/metrics", timeout=10).status_code == 503
    finally:
        frozen.send_signal(signal.SIGCONT)
    wait_until(lambda: requests.get(f"{probe}/metrics", timeout=10).status_code == 200, 60, what="/metrics back")
    assert requests.get(f"{probe}/health", timeout=10).status_code == 200
    healthy(server)


# --- memory ----------------------------------------------------------------------------------------
def test_prompt_logprobs_take_bounded_memory_and_give_it_back(server):
    """The issue's request: a 480-word prompt, n 4, echo, logprobs 5, max_tokens 1. The worker's
    peak grows by less than 300 MiB, and its resident memory comes back within 100 MiB."""
    proc = worker(server)
    prompt = " ".join(["word"] * 480)
    body = {"model": MODEL, "prompt": prompt, "n": 4, "echo": True, "logprobs": 5, "max_tokens": 1}
    r = requests.post(f"{server.url}{COMPLETIONS}", json=body, timeout=600)  # a first run: warm allocator
    assert r.status_code == 200, r.text[:500]
    before = proc.memory_info().rss
    Path(f"/proc/{proc.pid}/clear_refs").write_text("5")  # the peak (VmHWM) counts from now
    r = requests.post(f"{server.url}{COMPLETIONS}", json=body, timeout=600)
    assert r.status_code == 200 and len(r.json()["choices"]) == 4, r.text[:500]
    tokens = r.json()["choices"][0]["logprobs"]["tokens"]
    assert len(tokens) > 400
    peak = _vm_hwm(proc.pid)
    after = proc.memory_info().rss
    mib = 1 << 20
    assert peak - before < 300 * mib, f"peak {peak / mib:.0f} MiB against {before / mib:.0f} before"
    assert after - before < 100 * mib, f"after {after / mib:.0f} MiB against {before / mib:.0f} before"
    healthy(server)


def _vm_hwm(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    [line] = [line for line in status.splitlines() if line.startswith("VmHWM:")]
    return int(line.split()[1]) * 1024


# --- careless settings -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "env, name",
    [({"API_KEY": " "}, "API_KEY"), ({"API_KEY": ","}, "API_KEY"), ({"REQUEST_TIMEOUT_S": "nan"}, "REQUEST_TIMEOUT_S")]
    + [({"ENGINE_STALL_S": "inf"}, "ENGINE_STALL_S"), ({"BATCH_SIZE": "0"}, "BATCH_SIZE")],
)
def test_a_careless_setting_stops_gunicorn_in_one_line(env, name):
    """gunicorn's master reads the settings before it forks: nothing loads, nothing listens."""
    command = [str(Path(sys.executable).with_name("gunicorn")), "-c", "gunicorn.conf.py", "wsgi:app"]
    done = subprocess.run(
        command, cwd=ROOT, env={**os.environ, "PORT": "1", **env}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    [line] = [line for line in done.stderr.splitlines() if name in line]
    assert line.startswith("gunicorn: not starting:"), done.stderr
