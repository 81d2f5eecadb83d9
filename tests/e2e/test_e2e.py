"""End to end: the real gunicorn with gunicorn.conf.py, real HTTP with requests and curl."""

from __future__ import annotations

import json
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.helpers import wait_until
from tests.helpers.servers import KEY, auth


@pytest.fixture(scope="module")
def server(shared_server):
    return shared_server  # tests/e2e/conftest.py: the session's gunicorn, API_KEY set


def generate(server, path, body, **kw):
    return requests.post(f"{server.url}{path}", json=body, headers=auth(), timeout=300, **kw)


BEARER = ["-H", f"Authorization: Bearer {KEY}"]


def curl(*args: str) -> str:
    return subprocess.run(
        ["curl", "-s", *BEARER, *args], capture_output=True, text=True, timeout=300, check=True
    ).stdout


def test_both_engines_start_under_gunicorn(server):
    engines = server.health()["engines"]
    assert engines["static"]["status"] == "ready"
    assert engines["vllm"]["status"] == "ready", engines["vllm"]


def test_curl_generate_says_paris(server):
    out = curl(
        f"{server.url}/generate",
        "-H",
        "Content-Type: application/json",
        "-d",
        '{"prompts": ["The capital of France is"]}',
    )
    assert "Paris" in json.loads(out)["generated_texts"][0]


def test_six_prompts_run_as_rounds_of_four_and_two_in_the_log(server):
    mark = server.log_mark()  # the server is shared: only this request's rounds
    r = generate(server, "/generate", {"prompts": [f"Prompt {c}" for c in "abcdef"], "max_tokens": 3})
    assert r.status_code == 200 and len(r.json()["generated_texts"]) == 6
    shapes = re.findall(r"Batch input shape: torch\.Size\(\[(\d+), \d+\]\)", server.log_text(since=mark))
    assert shapes == ["4", "2"]


def test_concurrent_requests_on_both_paths_are_all_answered(server):
    jobs = [("/generate", {"prompts": [f"Number {i} is"], "max_tokens": 4}) for i in range(8)]
    jobs += [("/generate_vllm", {"prompts": [f"Number {i} is"], "max_tokens": 4}) for i in range(8)]
    jobs += [("/generate", {"prompts": ["A", "B", "C"], "max_tokens": 2})]
    with ThreadPoolExecutor(len(jobs)) as pool:
        replies = list(pool.map(lambda job: generate(server, *job), jobs))
    assert [r.status_code for r in replies] == [200] * len(jobs)
    static = [r.json()["generated_texts"][0] for r in replies[:8]]
    vllm = [r.json()["generated_texts"][0] for r in replies[8:16]]
    assert len(set(static)) > 1 and len(set(vllm)) > 1


def test_curl_concurrent_requests(server):
    body = '{"prompts": ["Hello there"], "max_tokens": 3}'
    procs = [
        subprocess.Popen(
            ["curl", "-s", *BEARER, f"{server.url}/generate", "-H", "Content-Type: application/json", "-d", body],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(len(json.loads(o)["generated_texts"]) == 1 for o in outs)


@pytest.mark.parametrize("path", ["/generate_stream", "/generate_vllm_stream"])
def test_curl_n_streams_one_event_per_token(server, path):
    body = '{"prompt": "The capital of France is", "max_tokens": 8}'
    out = curl("-N", f"{server.url}{path}", "-H", "Content-Type: application/json", "-d", body)
    evts = [json.loads(line.removeprefix("data: ")) for line in out.splitlines() if line.startswith("data: ")]
    assert "".join(e.get("token", "") for e in evts).startswith(" Paris")
    assert len(evts) >= 5 and evts[-1]["done"] is True


@pytest.mark.parametrize("path", ["/generate_stream", "/generate_vllm_stream"])
def test_a_client_that_leaves_after_the_first_token_costs_nothing_more(server, path):
    # long enough to be running when the client leaves, short enough that admission's prediction
    # on a busy 2-core machine stays inside REQUEST_TIMEOUT_S (400 tokens once got a reply with no
    # event at all there; the status now says what came instead)
    with generate(server, path, {"prompt": "Tell me a very long story about", "max_tokens": 200}, stream=True) as r:
        assert r.status_code == 200, r.text
        first = next(line for line in r.iter_lines() if line.startswith(b"data: "))
        assert "token" in json.loads(first[6:])
    # the connection is closed: the sequence is cancelled at its next step
    wait_until(
        lambda: server.engine("static").get("inflight") == 0 and server.engine("vllm").get("running") == 0,
        120,
        "the abandoned stream to be dropped",
    )
    assert generate(server, "/generate", {"prompts": ["Hi"], "max_tokens": 2}).status_code == 200


def test_metrics_endpoint(server):
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    assert "batcher_rounds_total" in text and "vllm_engine_steps_total" in text
