"""Drain on SIGTERM, as a user stops `make serve` with both engines (tests/e2e/conftest.py's
`served`): a running round, a queued one and an open vLLM stream, all answered in full, then
nothing left running. The engine alone: tests/integration/test_drain.py."""

from __future__ import annotations

import json
import re
import threading

import pytest
import requests

from tests.helpers import wait_until
from tests.helpers.make_serve import listening
from tests.helpers.servers import auth


def post(url, path, body, **kw):
    return requests.post(f"{url}{path}", json=body, headers=auth(), timeout=300, **kw)


def sse(lines) -> list[dict]:
    return [json.loads(line[6:]) for line in lines if line.startswith(b"data: ")]


@pytest.mark.last  # it stops `served`, which test_eval and test_slow_clients share
def test_ctrl_c_drains_a_running_round_a_queued_one_and_an_open_stream_then_stops_clean(served):
    replica, replies = served.replica_url, {}  # gunicorn itself: nginx stops after it

    def send(name, path, body):
        replies[name] = post(replica, path, body)

    static = served.engine("static")
    # a round of four long prompts, then a fifth prompt that waits for the next round
    running = threading.Thread(
        target=send,
        args=("running", "/generate", {"prompts": ["Tell me a story"] * 4, "max_tokens": 120, "ignore_eos": True}),
    )
    running.start()
    wait_until(lambda: served.engine("static").get("rounds", 0) > static["rounds"], 60, "the round to start")
    queued = threading.Thread(target=send, args=("queued", "/generate", {"prompts": ["Hi"], "max_tokens": 4}))
    queued.start()
    wait_until(lambda: served.engine("static").get("queued", 0) >= 1, 60, "the second round to wait")
    body = {"prompt": "Once upon a time", "max_tokens": 60, "ignore_eos": True}
    stream = post(replica, "/generate_vllm_stream", body, stream=True)
    lines = stream.iter_lines()
    first = next(line for line in lines if line.startswith(b"data: "))

    stopper = threading.Thread(target=served.stop)  # SIGTERM to make's group, as Ctrl-C; waits for the end
    stopper.start()
    wait_until(lambda: served.health(replica).get("status") == "draining", 30, "/health to say draining")
    health = requests.get(f"{replica}/health", timeout=10)
    refused = post(replica, "/generate", {"prompts": ["new work"]})
    refused_stream = post(replica, "/generate_stream", {"prompt": "new work"})

    rest = sse(lines)  # the open stream runs to its end
    running.join(300)
    queued.join(300)
    stopper.join(300)

    assert health.status_code == 503 and health.json()["status"] == "draining"
    for r in (refused, refused_stream):
        assert r.status_code == 503 and r.json()["type"] == "shutting_down"
        assert int(r.headers["Retry-After"]) >= 1
    assert replies["running"].status_code == 200, replies["running"].text
    assert [len(t) > 0 for t in replies["running"].json()["generated_texts"]] == [True] * 4
    assert replies["queued"].status_code == 200 and len(replies["queued"].json()["generated_texts"]) == 1
    tokens = sse([first]) + rest
    assert rest[-1] == {"sequence_id": tokens[0]["sequence_id"], "finish_reason": "length", "done": True}
    assert len({e["sequence_id"] for e in tokens}) == 1
    log = served.log_text()
    assert re.search(r"static engine drained in [\d.]+s: 5 sequences finished, 0 abandoned", log), log[-3000:]
    assert re.search(r"vllm engine drained in [\d.]+s: 1 sequences finished, 0 abandoned", log), log[-3000:]
    # nothing left running: neither nginx nor gunicorn listens, and under supervisord both exited 0
    assert not listening(served.port) and not listening(served.port + 1)
    if served.nginx:
        stopped = (served.run_dir / "supervisord.log").read_text()
        assert "stopped: replica1 (exit status 0)" in stopped and "stopped: nginx (exit status 0)" in stopped
        assert not (served.run_dir / "supervisord.pid").exists()  # supervisord stopped both and left
    else:
        assert "Worker exiting" in log and "Shutting down: Master" in log
