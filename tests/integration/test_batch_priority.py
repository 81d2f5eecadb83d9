"""Batch lines take only the spare room: marked by the batch runner in the WSGI environ (never a
header), they run at the lowest priority. The static engine held (conftest's held_rounds): what is
interactive runs first, finds room in the queue, and is predicted without the batch work queued; a
batch line holds no place under the in-flight cap; on vLLM, both run and the interactive answer is
the one it gets alone."""

from __future__ import annotations

import json
import threading

import pytest

from batcher.sequence import Priority, Sequence
from service.http.state import app_state
from service.jobs.runner import BATCH_LINE
from tests.helpers import wait_until
from tests.helpers.apps import static_app

LINE = {BATCH_LINE: True}  # what the batch runner sets on each line's request
QUEUE = 4  # the static app's MAX_QUEUE


@pytest.fixture(scope="module")
def static():
    """The static engine alone: rounds of two, a queue of four, a timeout no prediction reaches."""
    with static_app(batch_size=2, max_queue=QUEUE, request_timeout_s=3600) as app:
        yield app


class Posts:
    """Requests sent each from a thread of its own, as gunicorn (or the batch runner) serves them."""

    def __init__(self, app):
        self.app, self.replies, self.threads = app, {}, []

    def send(self, name: str, body: dict, environ: dict | None = None) -> None:
        def post():
            client = self.app.test_client()
            asked = {**body, "details": True}  # each prompt's round
            self.replies[name] = client.post("/generate", json=asked, environ_overrides=environ or {})

        self.threads.append(threading.Thread(target=post))
        self.threads[-1].start()

    def join(self) -> dict:
        for t in self.threads:
            t.join(300)
        return self.replies


def held_with_batch_queued(app, posts: Posts, lines: int):
    """The engine's round taken and held (one interactive prompt), `lines` batch prompts behind it."""
    engine = app_state(app).engines["static"]
    posts.send("held", {"prompts": ["Hold on"], "max_tokens": 2})
    wait_until(lambda: engine.running() == 1, what="the held round")
    posts.send("batch", {"prompts": [f"Line {i}" for i in range(lines)], "max_tokens": 2}, LINE)
    wait_until(lambda: engine.queued() == lines, what="the batch lines queued")
    return engine


def rounds(reply) -> list[int]:
    return [detail["round"] for detail in reply.json["details"]]


def test_interactive_prompts_sent_after_batch_lines_run_first_and_find_the_queue_open(static, held_rounds):
    posts = Posts(static)
    engine = held_with_batch_queued(static, posts, QUEUE)  # the queue is full of batch lines
    posts.send("interactive", {"prompts": ["Now 1", "Now 2"], "max_tokens": 2})
    wait_until(lambda: engine.queued() == QUEUE + 2, what="the interactive prompts admitted")
    refused = static.test_client().post("/generate", json={"prompts": ["One more"]}, environ_overrides=LINE)
    assert refused.status_code == 429 and refused.json["type"] == "queue_full"  # the batch line is refused
    held_rounds()
    replies = posts.join()
    assert {name: r.status_code for name, r in replies.items()} == {"held": 200, "batch": 200, "interactive": 200}
    [held] = rounds(replies["held"])
    assert rounds(replies["interactive"]) == [held + 1] * 2  # the round after the held one
    assert rounds(replies["batch"]) == [held + 2, held + 2, held + 3, held + 3]


def test_an_interactive_prediction_leaves_out_the_batch_work_queued(static, held_rounds):
    posts = Posts(static)
    engine = held_with_batch_queued(static, posts, 3)
    try:
        load = static.test_client().get("/load?prompts=1&max_tokens=2").json["engines"]["static"]
        assert load["ahead"] == 1, load  # the held round; the batch lines would run after it
        interactive = engine.check_admission([Sequence("Now", priority=Priority.INTERACTIVE)])
        batch = engine.check_admission([Sequence("Later", priority=Priority.BATCH)])
        assert (interactive.ahead, batch.ahead) == (1, 4)
    finally:
        held_rounds()
    assert {name: r.status_code for name, r in posts.join().items()} == {"held": 200, "batch": 200}


def test_a_batch_line_holds_no_place_under_the_in_flight_cap(static):
    gate, client = app_state(static).inflight, static.test_client()
    held = [gate.try_enter() for _ in range(gate.limit)]
    try:
        body = {"prompts": ["The capital of France is"], "max_tokens": 2}
        assert client.post("/generate", json=body).json["type"] == "too_busy"
        r = client.post("/generate", json=body, environ_overrides=LINE)
        assert r.status_code == 200, r.get_data(as_text=True)
        assert gate.held == gate.limit
        r = client.post("/generate", json=body, headers={"Service.Batch-Line": "1", "X-Batch-Line": "true"})
        assert r.json["type"] == "too_busy"  # no header makes a request a batch line
    finally:
        for slot in held:
            slot.release()


def priorities_added(app, monkeypatch) -> list[int]:
    """The `priority` of each request the app's vLLM engine is given from now on."""
    engine, added = app_state(app).engines["vllm"].engine, []
    add_request = engine.add_request

    def recording(*args, priority: int = 0, **kwargs):
        added.append(priority)
        return add_request(*args, priority=priority, **kwargs)

    monkeypatch.setattr(engine, "add_request", recording)
    return added


def test_on_vllm_a_batch_line_runs_last_in_vllms_own_queue_and_leaves_the_interactive_answer(vllm_app, monkeypatch):
    engine = app_state(vllm_app).engines["vllm"].engine
    assert engine.vllm_config.scheduler_config.policy == "priority"
    added = priorities_added(vllm_app, monkeypatch)
    body = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    alone = vllm_app.test_client().post("/v1/completions", json=body).json["choices"][0]["text"]
    assert added == [Priority.INTERACTIVE]
    replies: dict = {}

    def post(name: str, environ: dict) -> None:
        line = {**body, "prompt": "Once upon a time", "max_tokens": 32} if environ else body
        replies[name] = vllm_app.test_client().post("/v1/completions", json=line, environ_overrides=environ)

    threads = [threading.Thread(target=post, args=args) for args in (("batch", LINE), ("interactive", {}))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert [replies[name].status_code for name in ("batch", "interactive")] == [200, 200]
    assert replies["interactive"].json["choices"][0]["text"] == alone
    assert sorted(added) == [Priority.INTERACTIVE, Priority.INTERACTIVE, Priority.BATCH]


def test_the_runner_marks_each_line_it_runs(vllm_app, monkeypatch):
    """A line through the batch runner reaches vLLM at the batch priority."""
    state, added = app_state(vllm_app), priorities_added(vllm_app, monkeypatch)
    line = {"custom_id": "p", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Hi", "max_tokens": 2}}
    source = state.store.add_file("", "batch", "lines.jsonl", (json.dumps(line) + "\n").encode())
    batch = state.store.add_batch("", "vllm", "/v1/completions", source.id, "24h", None)
    state.runner.kick()
    done = state.runner.wait_for(batch.id, {"completed", "failed"}, 300)
    assert done is not None and done.status == "completed" and done.completed == 1, done
    assert added == [Priority.BATCH]
