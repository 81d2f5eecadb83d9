"""A background response survives `kill -9` of the worker running it, under a real gunicorn: the
master's fresh worker takes it up once the dead one's heartbeat is stale, runs it again from the
start, and it ends once, its events one stream numbered from 0. In process: the integration tier's
tests/integration/test_background_responses.py."""

from __future__ import annotations

import json
import os
import signal

import requests

from tests.e2e.test_batch_crash import env_for, worker_pid
from tests.helpers import wait_until
from tests.helpers.servers import serving

BASE = "/static/v1"
TERMINAL = ("response.completed", "response.incomplete")


def events(reply: requests.Response):
    for line in reply.iter_lines():
        if line.startswith(b"data: "):
            yield json.loads(line[6:])


def follow(server, response_id: str) -> list[dict] | None:
    """Every event of the response, from its first, once it has ended; None while nothing answers."""
    url = f"{server.url}{BASE}/responses/{response_id}?stream=true"
    try:
        with requests.get(url, stream=True, timeout=600) as reply:
            assert reply.status_code == 200, reply.text
            return list(events(reply))
    except requests.ConnectionError:
        return None


def test_kill_9_of_the_worker_mid_response_ends_it_once_in_the_fresh_worker(tmp_path):
    with serving(tmp_path, env_for(tmp_path / "data"), ready=("static",), disabled=("vllm",)) as server:
        pid = worker_pid(server)
        body = {"input": "Write a long story about a dragon.", "max_output_tokens": 200, "temperature": 0}
        started = requests.post(
            f"{server.url}{BASE}/responses", json={**body, "background": True, "stream": True}, stream=True, timeout=600
        )
        seen = []
        for event in events(started):
            seen.append(event)
            if len(seen) == 8:  # deltas arriving: the run is in its decoding
                break
        response_id = seen[0]["response"]["id"]
        assert seen[-1]["type"] == "response.output_text.delta", seen
        os.kill(pid, signal.SIGKILL)
        started.close()

        # followed from its start until it ends: a follow that began on the dead run's events ends
        # with an `error` saying the run started again (follow.py), and the client streams it again
        ended: list[list[dict] | None] = []

        def done_stream() -> bool:
            ended.append(follow(server, response_id))
            return bool(ended[-1]) and ended[-1][-1]["type"] in TERMINAL

        wait_until(done_stream, 600, "the response to end")
        stream = ended[-1]
        assert [e["sequence_number"] for e in stream] == list(range(len(stream)))
        assert stream[-1]["type"] in TERMINAL and sum(e["type"] in TERMINAL for e in stream) == 1
        done = requests.get(f"{server.url}{BASE}/responses/{response_id}", timeout=60).json()
        assert done["status"] == stream[-1]["response"]["status"] and done["output"] == stream[-1]["response"]["output"]
        assert worker_pid(server) != pid
        log = server.log_text()
        # the dead worker's run, then the fresh one's
        assert log.count(f"response {response_id}: running") == 2, log[-3000:]
