"""Batch jobs survive `kill -9` under a real gunicorn: of the worker mid-batch (the master starts a
fresh one) and of the whole service (a new one on the same DATA_DIR). The batch resumes by itself
and completes, every custom_id once in its output and none in both files; how long after the kill
the first line was recorded again (the pickup) is printed and logged, for docs/operations.md. An
upload cut half-way keeps no file. The runner and its claims in process: tests/integration/test_batch_runner.py."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import time

import requests

from deploy.server import Server
from service.jobs.store import Store
from tests.helpers import wait_until
from tests.helpers.servers import serving

log = logging.getLogger(__name__)

BASE = "/static/v1"
CHAT = "/v1/chat/completions"
LINES = 32  # enough rounds of BATCH_SIZE that a kill lands with lines done and lines left
FINAL = {"completed", "failed", "expired", "cancelled"}


def env_for(data_dir) -> dict[str, str]:
    return {"VLLM_ENABLED": "0", "TORCH_THREADS": "1", "DATA_DIR": str(data_dir)}


def submit(server) -> str:
    """A batch of LINES chat lines, uploaded and created over HTTP; its id."""
    items = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": CHAT,
            "body": {"messages": [{"role": "user", "content": f"Count from {i}."}], "max_tokens": 12, "temperature": 0},
        }
        for i in range(LINES)
    ]
    content = "".join(json.dumps(item) + "\n" for item in items).encode()
    files = {"file": ("lines.jsonl", content, "application/jsonl")}
    uploaded = requests.post(f"{server.url}{BASE}/files", data={"purpose": "batch"}, files=files, timeout=60)
    assert uploaded.status_code == 200, uploaded.text
    body = {"input_file_id": uploaded.json()["id"], "endpoint": CHAT, "completion_window": "24h"}
    made = requests.post(f"{server.url}{BASE}/batches", json=body, timeout=60)
    assert made.status_code == 200, made.text
    return made.json()["id"]


def batch(server, batch_id: str) -> dict | None:
    """The batch object, or None while nothing answers on the port (a service starting)."""
    try:
        reply = requests.get(f"{server.url}{BASE}/batches/{batch_id}", timeout=120)
    except requests.ConnectionError:
        return None
    assert reply.status_code == 200, reply.text
    return reply.json()


def recorded(found: dict | None) -> int:
    """Lines whose result is recorded (answered or failed)."""
    return -1 if found is None else found["request_counts"]["completed"] + found["request_counts"]["failed"]


def kill_mid_batch(server, batch_id: str, kill) -> float:
    """`kill()` once a line is recorded and lines remain; the time of the kill (monotonic)."""

    def mid_batch() -> bool:
        found = batch(server, batch_id)
        return found["status"] == "in_progress" and 1 <= recorded(found) < found["request_counts"]["total"]

    wait_until(mid_batch, 300, "a batch with lines done and lines left")
    kill()
    return time.monotonic()


def picked_up(server, batch_id: str, at_kill: int, killed_at: float, what: str) -> float:
    """Seconds from the kill to the first line recorded after it; printed and logged."""
    wait_until(lambda: recorded(batch(server, batch_id)) > at_kill, 600, f"a line recorded after {what}")
    pickup = time.monotonic() - killed_at
    print(f"\npickup after kill -9 of {what}: {pickup:.1f}s ({at_kill} of {LINES} lines recorded at the kill)")
    log.info("pickup after kill -9 of %s: %.1fs (%d of %d lines recorded at the kill)", what, pickup, at_kill, LINES)
    return pickup


def ended(server, batch_id: str) -> dict:
    wait_until(lambda: batch(server, batch_id)["status"] in FINAL, 600, "the batch to end")
    return batch(server, batch_id)


def jsonl(server, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    reply = requests.get(f"{server.url}{BASE}/files/{file_id}/content", timeout=60)
    assert reply.status_code == 200, reply.text
    return [json.loads(line) for line in reply.text.splitlines()]


def assert_every_line_once(server, done: dict) -> None:
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": LINES, "completed": LINES, "failed": 0}, done
    output, errors = jsonl(server, done["output_file_id"]), jsonl(server, done["error_file_id"])
    ids = [line["custom_id"] for line in output]
    assert sorted(ids) == sorted(f"line-{i}" for i in range(LINES)) and len(set(ids)) == LINES
    assert not {line["custom_id"] for line in errors} & set(ids)
    assert all(line["response"]["status_code"] == 200 for line in output)


def stored(data, batch_id: str) -> dict:
    """The batch as the database holds it, read by the test (no worker alive to answer)."""
    found = Store(f"sqlite:///{data / 'jobs.sqlite3'}").batch(None, batch_id)
    assert found is not None
    return found.to_openai()


def worker_pid(server) -> int:
    return int(re.findall(r"Booting worker with pid: (\d+)", server.log_text())[-1])


def test_kill_9_of_the_worker_mid_batch_resumes_it_in_the_fresh_worker(tmp_path):
    with serving(tmp_path, env_for(tmp_path / "data"), ready=("static",), disabled=("vllm",)) as server:
        batch_id = submit(server)
        pid, mark = worker_pid(server), server.log_mark()
        killed_at = kill_mid_batch(server, batch_id, lambda: os.kill(pid, signal.SIGKILL))
        at_kill = recorded(stored(tmp_path / "data", batch_id))  # before the fresh worker loads its model
        assert at_kill < LINES
        picked_up(server, batch_id, at_kill, killed_at, "the worker")
        assert worker_pid(server) != pid, server.log_text(mark)[-3000:]  # the master's fresh worker
        assert_every_line_once(server, ended(server, batch_id))
        text = server.log_text()
        assert f"batch {batch_id}: in_progress" in text  # store.py's line per state change
        assert f"batch {batch_id}: completed ({LINES} completed, 0 failed)" in text


def test_kill_9_of_the_whole_service_mid_batch_resumes_it_in_a_new_one(tmp_path):
    data = tmp_path / "data"
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    with serving(tmp_path / "first", env_for(data), ready=("static",), disabled=("vllm",)) as first:
        batch_id = submit(first)

        def kill_all() -> None:  # master, worker and probe server: the session gunicorn leads
            os.killpg(first.proc.pid, signal.SIGKILL)
            first.proc.wait(30)

        killed_at = kill_mid_batch(first, batch_id, kill_all)
    at_kill = recorded(stored(data, batch_id))
    assert at_kill < LINES
    # polled from its first moment (not once /health says ready): the pickup may come before that
    with Server(tmp_path / "second" / "server.log", env_for(data)) as second:
        picked_up(second, batch_id, at_kill, killed_at, "the whole service")
        assert_every_line_once(second, ended(second, batch_id))
        text = second.log_text()
        assert f"batch {batch_id}: completed ({LINES} completed, 0 failed)" in text


def test_an_upload_cut_half_way_keeps_no_file(tmp_path):
    with serving(tmp_path, env_for(tmp_path / "data"), ready=("static",), disabled=("vllm",)) as server:
        listed = requests.get(f"{server.url}{BASE}/files", timeout=60)
        assert listed.status_code == 200, listed.text
        before = [f["id"] for f in listed.json()["data"]]
        head = cut_upload(server)
        assert not head or head.split()[1].startswith(b"4"), head  # refused, or closed unanswered
        after = [f["id"] for f in requests.get(f"{server.url}{BASE}/files", timeout=60).json()["data"]]
        assert after == before, after


def cut_upload(server) -> bytes:
    """A multipart upload whose body stops half-way: the headers promise more bytes than come,
    then the client's side closes. Waits for the service's end of it (its answer, or its close),
    so that whatever it would keep is kept before the listing. The status line it answered, if any."""
    boundary = "cut-boundary"
    lines = b"".join(json.dumps({"custom_id": f"c{i}", "body": {}}).encode() + b"\n" for i in range(200))
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="cut.jsonl"\r\n'
        "Content-Type: application/jsonl\r\n\r\n"
    ).encode() + lines
    closing = f"\r\n--{boundary}--\r\n".encode()
    sent = body[: len(body) // 2]
    host, port = server.url.removeprefix("http://").split(":")
    head = (
        f"POST {BASE}/files HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
        f"Content-Length: {len(body) + len(closing)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=120) as sock:
        sock.sendall(head + sent)
        sock.shutdown(socket.SHUT_WR)  # the cut: no more bytes will come
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply.split(b"\r\n", 1)[0]
