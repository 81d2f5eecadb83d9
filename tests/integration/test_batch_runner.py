"""Batches run by the app's own runner (service/jobs/runner.py) on both engines: every line once,
each answer the online route's, a bad line in the error file with the route's error, a bad file
failing the batch, a cancelled batch ending cancelled."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import update

from service.http.state import app_state
from service.jobs.tables import batches
from tests.helpers import BASES

CHAT = "/v1/chat/completions"
ENGINES = {"/v1": "vllm", "/static/v1": "static"}
QUESTIONS = ["What is the capital of France?", "Name a colour.", "Say hi.", "Count to three."]


def chat_body(question: str, **fields) -> dict:
    return {"messages": [{"role": "user", "content": question}], "max_tokens": 6, "temperature": 0, **fields}


def submit(app, base: str, items: list[dict], endpoint: str = CHAT):
    state = app_state(app)
    content = "".join(json.dumps(item) + "\n" for item in items).encode()
    source = state.store.add_file("", "batch", "lines.jsonl", content)
    batch = state.store.add_batch("", ENGINES[base], endpoint, source.id, "24h", None)
    state.runner.kick()
    return batch


def ended(app, batch, timeout: float = 300):
    done = app_state(app).runner.wait_for(batch.id, {"completed", "failed", "cancelled", "expired"}, timeout)
    assert done is not None, app_state(app).store.batch(None, batch.id)
    return done


def read_jsonl(app, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in b"".join(app_state(app).store.content("", file_id)).decode().splitlines()]


def without_ids(body: dict) -> dict:
    return {k: v for k, v in body.items() if k not in ("id", "created")}


@BASES
def test_every_line_runs_once_and_answers_as_the_online_route(vllm_app, base):
    items = [
        {"custom_id": f"q{i}", "method": "POST", "url": CHAT, "body": chat_body(q)} for i, q in enumerate(QUESTIONS)
    ]
    items.append({"custom_id": "bad", "method": "POST", "url": CHAT, "body": chat_body("hi", max_tokens=-1)})
    batch = ended(vllm_app, submit(vllm_app, base, items))
    assert batch.status == "completed" and (batch.total, batch.completed, batch.failed) == (5, 4, 1), batch
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
    output, errors = read_jsonl(vllm_app, batch.output_file_id), read_jsonl(vllm_app, batch.error_file_id)
    assert sorted(x["custom_id"] for x in output) == sorted(f"q{i}" for i in range(4))
    assert [x["custom_id"] for x in errors] == ["bad"]
    client = vllm_app.test_client()
    for line in output:
        online = client.post(f"{base}/chat/completions", json=items[int(line["custom_id"][1:])]["body"])
        assert line["response"]["status_code"] == 200 and line["error"] is None
        assert without_ids(line["response"]["body"]) == without_ids(online.json)
    refused = client.post(f"{base}/chat/completions", json=items[-1]["body"])
    assert errors[0]["response"]["status_code"] == refused.status_code == 400
    assert errors[0]["response"]["body"] == refused.json  # the route's own error JSON


def test_a_completions_batch_runs_on_its_route(vllm_app):
    url = "/v1/completions"
    body = {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
    batch = ended(
        vllm_app, submit(vllm_app, "/static/v1", [{"custom_id": "p", "method": "POST", "url": url, "body": body}], url)
    )
    [line] = read_jsonl(vllm_app, batch.output_file_id)
    online = vllm_app.test_client().post("/static/v1/completions", json=body)
    assert without_ids(line["response"]["body"]) == without_ids(online.json)


@pytest.mark.parametrize(
    ("items", "code"),
    [
        ([{"custom_id": "a", "method": "POST", "url": CHAT, "body": {}}] * 2, "duplicate_custom_id"),
        ([{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}], "mismatched_endpoint"),
    ],
)
def test_a_bad_file_fails_the_batch_and_runs_nothing(app, items, code):
    batch = ended(app, submit(app, "/static/v1", items))
    assert batch.status == "failed" and batch.failed_at and batch.errors[0]["code"] == code
    assert batch.total == 0 and batch.output_file_id is None


def test_a_stream_line_is_an_error_line(app):
    item = {"custom_id": "s", "method": "POST", "url": CHAT, "body": chat_body("hi", stream=True)}
    batch = ended(app, submit(app, "/static/v1", [item]))
    [line] = read_jsonl(app, batch.error_file_id)
    assert batch.status == "completed" and line["response"] is None and line["error"]["param"] == "stream"


def test_a_batch_cancelled_before_it_ran_ends_cancelled(app):
    state = app_state(app)
    source = state.store.add_file("", "batch", "in.jsonl", json.dumps({"custom_id": "a"}).encode())
    batch = state.store.add_batch("", "static", CHAT, source.id, "24h", None)
    assert state.store.cancel("", batch.id).status == "cancelling"
    state.runner.kick()
    done = ended(app, batch)
    assert done.status == "cancelled" and done.cancelled_at and done.output_file_id is None


def test_a_batch_past_its_window_ends_expired_and_its_unrun_lines_say_so(app):
    state = app_state(app)
    content = "".join(
        json.dumps({"custom_id": f"e{i}", "method": "POST", "url": CHAT, "body": chat_body("hi")}) + "\n"
        for i in range(2)
    )
    source = state.store.add_file("", "batch", "in.jsonl", content.encode())
    batch = state.store.add_batch("", "static", CHAT, source.id, "24h", None)
    with state.store.db.begin() as db:  # its window over before it ran a line
        db.execute(update(batches).where(batches.c.id == batch.id).values(expires_at=batch.created_at))
    state.runner.kick()
    done = ended(app, batch)
    assert done.status == "expired" and done.expired_at and done.output_file_id is None
    errors = read_jsonl(app, done.error_file_id)
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [("e0", "batch_expired"), ("e1", "batch_expired")]
