"""The HTTP API through Flask's test client, on the real app and model: replies and every error."""

import dataclasses
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families

from service import shutdown
from service.http.state import app_state
from tests.helpers import wait_until
from tests.helpers.apps import enqueued, post, static_app

PARIS = {"prompts": ["The capital of France is"], "max_tokens": 5}


def test_generate_answers_paris_without_echoing_the_prompt(client):
    r = post(client, "/generate", PARIS)
    assert r.status_code == 200, r.json
    [text] = r.json["generated_texts"]
    assert text.startswith(" Paris") and "capital" not in text


def test_generate_keeps_prompt_order_and_splits_six_prompts_into_4_and_2(client):
    prompts = ["One", "Two", "Three", "Four", "Five", "Six"]
    r = post(client, "/generate", {"prompts": prompts, "max_tokens": 3, "details": True})
    assert r.status_code == 200
    assert len(r.json["generated_texts"]) == 6
    details = r.json["details"]
    rounds = [d["round"] for d in details]
    assert rounds[:4] == [rounds[0]] * 4 and rounds[4:] == [rounds[0] + 1] * 2
    assert [d["batch_size"] for d in details] == [4, 4, 4, 4, 2, 2]
    assert details[0]["batch_shape"][0] == 4 and details[4]["batch_shape"][0] == 2
    assert all(d["tokens"] <= 3 and d["finish_reason"] in ("length", "stop") for d in details)
    assert details[4]["queue_ms"] >= details[0]["queue_ms"]  # the last two waited for a round
    # the headers are the longest wait and the longest run among the prompts, in seconds
    assert float(r.headers["x-queue-time"]) == pytest.approx(max(d["queue_ms"] for d in details) / 1000, abs=1e-3)
    assert float(r.headers["x-inference-time"]) == pytest.approx(
        max(d["inference_ms"] for d in details) / 1000, abs=1e-3
    )


def test_basic_generate_runs_one_prompt_as_a_batch_of_one(client):
    r = post(client, "/basic_generate", {"prompt": "The capital of France is", "max_tokens": 5, "details": True})
    assert r.status_code == 200
    assert r.json["generated_text"].startswith(" Paris")
    assert r.json["details"][0]["batch_size"] == 1


def test_basic_generate_never_shares_a_round_under_concurrent_generate_load(app, held_rounds):
    engine, replies, threads = app_state(app).engines["static"], {}, []

    def send(name, path, body):
        def ask():
            replies[name] = post(app.test_client(), path, {**body, "max_tokens": 3, "details": True})

        threads.append(threading.Thread(target=ask))
        threads[-1].start()

    send("first", "/generate", {"prompts": ["Hold on"]})  # taken into a round that waits for the lock
    wait_until(lambda: engine.running() == 1 and engine.workload.qsize() == 0, what="the held round")
    send("before", "/generate", {"prompts": ["One", "Two", "Three", "Four"]})
    wait_until(lambda: engine.workload.qsize() == 4, what="four queued prompts")
    send("basic", "/basic_generate", {"prompt": "The capital of France is"})
    wait_until(lambda: engine.workload.qsize() == 5, what="the basic prompt queued behind them")
    send("after", "/generate", {"prompts": ["Five", "Six", "Seven", "Eight"]})
    wait_until(lambda: engine.workload.qsize() == 9, what="four more queued behind it")
    held_rounds()
    for t in threads:
        t.join(120)
    assert all(r.status_code == 200 for r in replies.values())
    before, after = replies["before"].json["details"], replies["after"].json["details"]
    [basic] = replies["basic"].json["details"]
    assert [d["batch_size"] for d in before + after] == [4] * 8  # the other rounds are full
    assert len({d["round"] for d in before}) == 1 and len({d["round"] for d in after}) == 1
    assert (basic["batch_size"], basic["batch_shape"][0]) == (1, 1)
    assert before[0]["round"] < basic["round"] < after[0]["round"]
    assert replies["basic"].json["generated_text"].startswith(" Paris")


def test_greedy_by_default_so_the_same_prompt_gives_the_same_text(client):
    first = post(client, "/generate", PARIS).json
    second = post(client, "/generate", PARIS).json
    assert first == second


def test_an_empty_list_answers_an_empty_list(client):
    r = post(client, "/generate", {"prompts": []})
    assert r.status_code == 200 and r.json == {"generated_texts": []}


@pytest.mark.parametrize(
    "body, status, kind",
    [
        ("{not json", 400, "invalid_json"),
        ("[1, 2]", 422, "invalid_request"),
        ({}, 422, "invalid_request"),
        ({"prompts": "a string"}, 422, "invalid_request"),
        ({"prompts": ["ok", 3]}, 422, "invalid_request"),
        ({"prompts": [""]}, 422, "invalid_request"),
        ({"prompts": ["ok"], "max_tokens": 0}, 422, "invalid_request"),
        ({"prompts": ["ok"], "max_tokens": 513}, 422, "invalid_request"),
        ({"prompts": ["ok"], "max_tokens": "5"}, 422, "invalid_request"),
        ({"prompts": ["ok"], "max_tokens": True}, 422, "invalid_request"),
        ({"prompts": ["ok"], "temperature": -0.1}, 422, "invalid_request"),
        ({"prompts": ["ok"], "top_p": 0}, 422, "invalid_request"),
        ({"prompts": ["ok"], "top_p": 1.5}, 422, "invalid_request"),
        ({"prompts": ["ok"], "details": "yes"}, 422, "invalid_request"),
        ({"prompts": ["ok"], "ignore_eos": 1}, 422, "invalid_request"),
        ({"prompts": ["p"] * 17}, 413, "too_many_prompts"),  # the app fixture allows 16
        ({"prompts": ["x" * 70_000]}, 413, "body_too_large"),  # the app fixture allows 64 KiB
    ],
)
@pytest.mark.parametrize("path", ["/generate", "/generate_vllm"])
def test_bad_input_gets_a_json_error_and_changes_nothing(app, client, path, body, status, kind):
    before = enqueued(app)  # the session's app: what earlier tests left may still be running
    r = post(client, path, body)
    assert r.status_code == status, r.json
    assert r.json["type"] == kind and r.json["error"]
    assert enqueued(app) == before  # nothing of it reached either engine


@pytest.mark.parametrize("body", [{"prompt": 5}, {"prompt": ""}, {"prompt": "ok", "max_tokens": -1}])
@pytest.mark.parametrize("path", ["/basic_generate", "/generate_stream", "/generate_vllm_stream"])
def test_single_prompt_endpoints_validate_too(client, path, body):
    r = post(client, path, body)
    assert r.status_code == 422 and r.json["type"] == "invalid_request"
    # /generate's list, sent here: an unknown field (tests/integration/test_fields.py), the right name suggested
    r = post(client, path, {"prompts": ["a list"]})
    assert r.status_code == 400 and "'prompts' (did you mean 'prompt'?)" in r.json["error"], r.json


@pytest.fixture
def short_timeout_app(tmp_path):
    """An app of its own with a REQUEST_TIMEOUT_S of 0.5 s, static engine alone, and no machine
    profile: fresh, it prices nothing, so it admits what reaches it idle."""
    with static_app(request_timeout_s=0.5, profile_dir=str(tmp_path)) as app:
        yield app


def test_a_deadline_passed_answers_504_and_leaves_nothing_behind(short_timeout_app, held_rounds):
    # admitted (its engine is idle), then the round cannot run before the test releases it: the
    # deadline passes in the queue (a request predicted past it is a 429 at once: test_admission.py)
    app, client = short_timeout_app, short_timeout_app.test_client()
    r = post(client, "/generate", {"prompts": ["Tell me a long story about"] * 6, "max_tokens": 200})
    assert r.status_code == 504 and r.json["type"] == "deadline_exceeded"
    engine = app_state(app).engines["static"]
    held_rounds()  # the round runs its cancelled sequences for one step; the queued ones are skipped
    wait_until(lambda: engine.inflight() == 0, 60, "the timed-out sequences to be dropped")
    app_state(app).config = dataclasses.replace(app_state(app).config, request_timeout_s=120)  # its own app
    assert post(client, "/generate", PARIS).status_code == 200  # the model thread lives on


def test_health_reports_each_engine(client):
    r = client.get("/health")
    assert r.status_code == 200
    engines = r.json["engines"]
    assert engines["static"]["status"] == "ready"
    assert engines["vllm"]["status"] in ("loading", "ready")
    assert r.json["peak_memory_gib"] > 0.25  # this process's own peak: at least the model's weights
    assert 0.25 < r.json["memory_gib"] <= r.json["peak_memory_gib"]  # now: at most its peak
    assert r.json["memory_budget_gib"] == 2.5  # MEMORY_BUDGET_GIB's default, beside what it bounds


def test_metrics_are_prometheus_text_that_counts_rounds_and_tokens(client):
    post(client, "/generate", PARIS)
    r = client.get("/metrics")
    assert r.status_code == 200 and r.mimetype == "text/plain"
    samples = {s.name: s.value for f in text_string_to_metric_families(r.text) for s in f.samples if not s.labels}
    labelled = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(r.text)
        for s in f.samples
    }
    assert "batcher_queue_depth" in samples and "batcher_inflight_sequences" in samples
    assert labelled[("batcher_rounds_total", (("outcome", "ok"),))] >= 1
    assert labelled[("generated_tokens_total", (("engine", "static"),))] >= 1
    assert labelled[("prompts_total", (("engine", "static"),))] >= 1
    assert samples["batcher_round_seconds_count"] >= 1
    assert any(name == "request_latency_seconds_count" for name, _ in labelled)
    assert "vllm_running_requests" in samples and "vllm_engine_steps_total" in samples


@pytest.fixture
def tiny_queue_app():
    with static_app(max_queue=3) as app:
        yield app


def test_a_request_the_queue_could_never_hold_is_a_400_naming_both_sizes(tiny_queue_app):
    engine = app_state(tiny_queue_app).engines["static"]
    r = post(tiny_queue_app.test_client(), "/generate", {"prompts": ["a", "b", "c", "d"]})
    assert r.status_code == 400 and r.json["type"] == "request_too_large", r.json  # no retry could fit it
    assert "4 sequences" in r.json["error"] and "at most 3" in r.json["error"] and "Retry-After" not in r.headers
    assert engine.inflight() == 0
    ok = post(tiny_queue_app.test_client(), "/generate", {"prompts": ["a", "b", "c"], "max_tokens": 2})
    assert ok.status_code == 200


def test_a_full_queue_answers_429_with_retry_after_and_enqueues_nothing(tiny_queue_app, held_rounds):
    engine, replies = app_state(tiny_queue_app).engines["static"], []

    def send(body):
        t = threading.Thread(target=lambda: replies.append(post(tiny_queue_app.test_client(), "/generate", body)))
        t.start()
        return t

    threads = [send({"prompts": ["held"], "max_tokens": 2})]  # taken, its round held by the test
    wait_until(lambda: engine.running() == 1, what="the held round")
    threads.append(send({"prompts": ["a", "b", "c"], "max_tokens": 2}))  # the queue, full
    wait_until(lambda: engine.workload.qsize() == 3, what="a full queue")
    r = post(tiny_queue_app.test_client(), "/generate", {"prompts": ["one more"]})
    assert r.status_code == 429 and r.json["type"] == "queue_full"
    assert int(r.headers["Retry-After"]) >= 1
    assert engine.workload.qsize() == 3  # nothing of it enqueued
    held_rounds()
    for t in threads:
        t.join(120)
    assert [reply.status_code for reply in replies] == [200, 200]


def test_a_disabled_vllm_engine_answers_503_with_the_reason(tiny_queue_app):
    r = post(tiny_queue_app.test_client(), "/generate_vllm", PARIS)
    assert r.status_code == 503 and r.json["type"] == "engine_unavailable"
    assert "VLLM_ENABLED" in r.json["error"]
    health = tiny_queue_app.test_client().get("/health")
    assert health.status_code == 200 and health.json["engines"]["vllm"]["status"] == "disabled"


def test_a_shut_down_engine_answers_503(tiny_queue_app):
    shutdown(tiny_queue_app)
    r = post(tiny_queue_app.test_client(), "/generate", PARIS)
    assert r.status_code == 503 and r.json["type"] == "shutting_down"
