"""Admission against a deadline (X-Max-Queue-Ms, max_queue_ms) and /load, on the real app: the
static engine held busy by a known backlog (conftest's held_rounds), vLLM with a 0 ms deadline
(the same on the real gunicorn: tests/e2e/test_admission.py)."""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.http.state import app_state
from tests.helpers import wait_until
from tests.helpers.apps import post, prompts_counted, static_app

GENEROUS = "3600000"  # an hour: never refused, even on a starved CPU
ROUTES = {  # (path, body) per route family, all on the static engine
    "demo": ("/generate", {"prompts": ["The capital of France is"], "max_tokens": 3}),
    "basic": ("/basic_generate", {"prompt": "The capital of France is", "max_tokens": 3}),
    "demo_stream": ("/generate_stream", {"prompt": "The capital of France is", "max_tokens": 3}),
    "completions": ("/static/v1/completions", {"prompt": "The capital of France is", "max_tokens": 3}),
    "chat_stream": (
        "/static/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": True},
    ),
}


@pytest.fixture
def backlog_app():
    """An app of its own, static engine alone, with a REQUEST_TIMEOUT_S of an hour: a timeout no
    prediction reaches, even on a starved CPU, so that the deadline alone decides here."""
    with static_app(request_timeout_s=3600) as app:
        yield app


@pytest.fixture
def backlog(request, backlog_app):
    """`backlog_app`'s engine busy: one round taken and held, eight prompts of 8 tokens queued
    behind it, so any new request's first token is at least two full rounds away (seconds on this
    CPU, far past the tests' 200 ms; 8 tokens, not more, since the backlog runs out after each
    test). Yields the engine; the backlog is answered (200) when the test lets go."""
    app = backlog_app
    engine = app_state(app).engines["static"]
    # measured first, widths 1 and 4 (the held round below must not be the first measurement)
    for width in (1, 4):
        reply = post(app.test_client(), "/generate", {"prompts": ["Warm"] * width, "max_tokens": 4})
        assert reply.status_code == 200
    held_rounds = request.getfixturevalue("held_rounds")  # only now: the warm-up above had to run
    replies: list = []

    def send(body):
        t = threading.Thread(target=lambda: replies.append(post(app.test_client(), "/generate", body)))
        t.start()
        return t

    threads = [send({"prompts": ["Hold on"], "max_tokens": 8, "ignore_eos": True})]
    wait_until(lambda: engine.running() == 1, what="the held round")
    threads.append(send({"prompts": [f"Queued {i}" for i in range(8)], "max_tokens": 8, "ignore_eos": True}))
    wait_until(lambda: engine.workload.qsize() == 8, 120, what="eight queued prompts")
    yield engine
    held_rounds()
    for t in threads:
        t.join(120)
    assert [r.status_code for r in replies] == [200, 200]


# Every route, with the deadline in the header and in the body, against one backlog: a refused
# request enqueues nothing, so the backlog is the same for each (ten backlogs, one per case, spent
# ~45 s here running out after each test).
def test_a_deadline_the_backlog_cannot_meet_is_429_at_once_and_enqueues_nothing(backlog_app, backlog):
    app, client = backlog_app, backlog_app.test_client()
    for route, where in [(route, where) for route in ROUTES for where in ("header", "body")]:
        path, body = ROUTES[route]
        if where == "body":
            body = {**body, "max_queue_ms": 200}
        case = (route, where)
        counted = prompts_counted(app, "static")
        r = post(client, path, body, {"X-Max-Queue-Ms": "200"} if where == "header" else {})
        assert r.status_code == 429, (case, r.get_data(as_text=True))
        error = r.json["error"]
        if path.startswith("/static/v1"):  # OpenAI's shape, so that the SDK retries after Retry-After
            assert error["type"] == "rate_limit_error" and error["code"] == "wait_too_long", case
            predicted = error["predicted"]
        else:
            assert r.json["type"] == "wait_too_long", case
            predicted = r.json["predicted"]
        assert predicted["ttft_p90_ms"] > 200 and predicted["ahead"] == 9, (case, predicted)  # the 90th percentile
        assert int(r.headers["Retry-After"]) >= max(1, predicted["queue_ms"] / 1000), case
        assert float(r.headers["x-predicted-wait"]) * 1000 == pytest.approx(predicted["queue_ms"], abs=0.2), case
        assert backlog.workload.qsize() == 8 and prompts_counted(app, "static") == counted, case  # nothing enqueued


@pytest.mark.parametrize("mode", ["concurrent", "batch"])
def test_the_race_feed_goes_through_admission_as_the_generate_routes_do(backlog_app, backlog, mode):
    """A race whose rows the backlog keeps past its deadline: each row ends refused (429
    `wait_too_long`) at once, and nothing is enqueued. The feed is read in a thread of its own, so
    that a feed that admitted its rows (and waited behind the held round) fails here, not hangs."""
    body = {"engine": "static", "mode": mode, "prompts": ["a", "b"], "max_tokens": 3}
    counted, events, ended = prompts_counted(backlog_app, "static"), [], threading.Event()

    def read():
        reply = post(backlog_app.test_client(), "/race", body, {"X-Max-Queue-Ms": "200"})
        events.extend(json.loads(line[6:]) for line in reply.get_data(as_text=True).splitlines() if line.strip())
        ended.set()

    threading.Thread(target=read, daemon=True).start()
    assert ended.wait(120), "the race feed admitted its rows: it waits behind the backlog"
    assert events[-1] == {"race_done": True}
    refused = [e for e in events if e.get("type") == "wait_too_long"]
    assert sorted(e["index"] for e in refused) == [0, 1] and all(e["status"] == 429 for e in refused), events
    assert backlog.workload.qsize() == 8 and prompts_counted(backlog_app, "static") == counted  # nothing enqueued


def test_the_same_request_with_a_generous_deadline_waits_and_is_answered(backlog_app, backlog, held_rounds):
    app, replies = backlog_app, {}

    def ask(name):
        path, body = ROUTES[name]
        replies[name] = post(app.test_client(), path, body, {"X-Max-Queue-Ms": GENEROUS})

    threads = [threading.Thread(target=ask, args=(name,)) for name in ("demo", "completions")]
    for t in threads:
        t.start()
    wait_until(lambda: backlog.workload.qsize() == 10, what="both requests queued behind the backlog")
    held_rounds()  # the backlog runs, then them
    for t in threads:
        t.join(120)
    assert {name: r.status_code for name, r in replies.items()} == {"demo": 200, "completions": 200}
    predicted = float(replies["demo"].headers["x-predicted-wait"])
    assert predicted > 0 and float(replies["demo"].headers["x-queue-time"]) > 0


def test_no_deadline_but_past_request_timeout_is_429_not_a_504_later(backlog_app, backlog):
    # its own app's REQUEST_TIMEOUT_S lowered now that the backlog is queued (which it would have refused)
    app = backlog_app
    app_state(app).config = dataclasses.replace(app_state(app).config, request_timeout_s=0.5)
    r = post(app.test_client(), "/generate", {"prompts": ["Too late"], "max_tokens": 8})  # the backlog takes seconds
    assert r.status_code == 429 and r.json["type"] == "wait_too_long"
    assert "REQUEST_TIMEOUT_S" in r.json["error"] and r.json["predicted"]["total_ms"] > 500
    assert backlog.workload.qsize() == 8


@pytest.mark.parametrize(
    ("path", "body", "headers", "field"),
    [
        ("/generate", {"prompts": ["a"]}, {"X-Max-Queue-Ms": "-1"}, "X-Max-Queue-Ms"),
        ("/generate", {"prompts": ["a"]}, {"X-Max-Queue-Ms": "soon"}, "X-Max-Queue-Ms"),
        ("/generate", {"prompts": ["a"], "max_queue_ms": -5}, {}, "max_queue_ms"),
        ("/generate_stream", {"prompt": "a", "max_queue_ms": "200"}, {}, "max_queue_ms"),
        ("/generate_vllm", {"prompts": ["a"], "max_queue_ms": True}, {}, "max_queue_ms"),
        ("/static/v1/completions", {"prompt": "a", "max_queue_ms": "fast"}, {}, "max_queue_ms"),
        ("/v1/completions", {"prompt": "a"}, {"X-Max-Queue-Ms": "nan"}, "X-Max-Queue-Ms"),
        (
            "/static/v1/chat/completions",
            {"messages": [{"role": "user", "content": "a"}], "stream": True, "max_queue_ms": -1},
            {},
            "max_queue_ms",
        ),  # noqa: E501
    ],
)
def test_a_bad_deadline_is_400_naming_the_field_and_enqueues_nothing(vllm_app, path, body, headers, field):
    counted = {name: prompts_counted(vllm_app, name) for name in ("static", "vllm")}
    r = post(vllm_app.test_client(), path, body, headers)
    assert r.status_code == 400, r.get_data(as_text=True)
    error = r.json["error"]
    if isinstance(error, dict):  # OpenAI's shape
        assert error["param"] == field and error["type"] == "invalid_request_error"
    else:
        assert r.json["type"] == "invalid_request" and field in error
    assert {name: prompts_counted(vllm_app, name) for name in counted} == counted


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/generate_vllm", {"prompts": ["a"], "max_tokens": 3}),
        ("/generate_vllm_stream", {"prompt": "a", "max_tokens": 3}),
        ("/v1/completions", {"prompt": "a", "max_tokens": 3}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "max_tokens": 3, "stream": True}),
    ],
)
def test_vllm_routes_refuse_a_deadline_no_first_token_can_meet(vllm_client, path, body):
    # once vLLM has run a request, its first token is never 0 ms away
    assert post(vllm_client, "/generate_vllm", {"prompts": ["Warm up"], "max_tokens": 4}).status_code == 200
    r = post(vllm_client, path, {**body, "max_queue_ms": 0})
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
    assert "wait_too_long" in json.dumps(r.json)
    ok = post(vllm_client, path, body, {"X-Max-Queue-Ms": GENEROUS})
    assert ok.status_code == 200 and ok.headers["x-predicted-wait"] != "unknown"


def test_load_predicts_per_engine_for_the_sizes_asked(vllm_client):
    # each engine measured at the widths asked below: a width never measured is unknown, and one
    # is bounded by a wider one (batcher/predict.py)
    assert post(vllm_client, "/generate", {"prompts": ["Warm"] * 4, "max_tokens": 4}).status_code == 200
    assert post(vllm_client, "/generate_vllm", {"prompts": ["Warm"] * 8, "max_tokens": 4}).status_code == 200
    one = vllm_client.get("/load").json["engines"]
    four = vllm_client.get("/load?prompts=8&max_tokens=64").json["engines"]
    for name in ("static", "vllm"):
        assert one[name]["prompts"] == 1 and one[name]["ttft_ms"] > 0
        assert four[name]["prompts"] == 8 and four[name]["max_tokens"] == 64
        assert four[name]["total_ms"] > one[name]["total_ms"]  # 64 tokens take longer than 20
    # static: eight prompts are two rounds, so their last prompt starts after a whole round
    assert four["static"]["total_ms"] > 2 * four["static"]["ttft_ms"]
    health = vllm_client.get("/health").json["engines"]
    assert health["static"]["predicted"]["ttft_ms"] > 0 and health["vllm"]["predicted"]["max_tokens"] == 20


@pytest.mark.parametrize("query", ["prompts=0", "prompts=many", "max_tokens=100000", "max_tokens=-3"])
def test_load_refuses_bad_sizes_naming_the_field(client, query):
    r = client.get(f"/load?{query}")
    assert r.status_code == 400 and query.split("=")[0] in r.json["error"]


def test_metrics_under_vllms_names_count_both_engines(vllm_client):
    def sample(text, name, engine):
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and s.labels.get("engine") == engine:
                    return s.value
        return None

    for path in ("/generate", "/generate_vllm"):  # measured at width 2: the requests below are predicted
        assert post(vllm_client, path, {"prompts": ["Warm", "Up"], "max_tokens": 4}).status_code == 200
    before = vllm_client.get("/metrics").get_data(as_text=True)
    body = {"prompts": ["Count me", "And me"], "max_tokens": 4, "ignore_eos": True}
    for path in ("/generate", "/generate_vllm"):
        assert post(vllm_client, path, body).status_code == 200
    text = vllm_client.get("/metrics").get_data(as_text=True)
    for engine in ("static", "vllm"):
        grew = {
            name: (sample(text, name, engine) or 0) - (sample(before, name, engine) or 0)
            for name in (
                "vllm:generation_tokens_total",
                "vllm:time_to_first_token_seconds_count",
                "vllm:e2e_request_latency_seconds_count",
                "vllm:request_queue_time_seconds_count",
                "vllm:inter_token_latency_seconds_count",
            )
        }
        assert grew == {
            "vllm:generation_tokens_total": 8,
            "vllm:time_to_first_token_seconds_count": 2,
            "vllm:e2e_request_latency_seconds_count": 2,
            "vllm:request_queue_time_seconds_count": 2,
            "vllm:inter_token_latency_seconds_count": 6,  # three intervals per sequence
        }, engine
        assert sample(text, "vllm:prompt_tokens_total", engine) > (
            sample(before, "vllm:prompt_tokens_total", engine) or 0
        )
        assert sample(text, "vllm:num_requests_running", engine) == 0
        assert sample(text, "vllm:num_requests_waiting", engine) == 0
        errors = sample(text, "batcher_ttft_prediction_error_ratio_count", engine)
        assert errors - (sample(before, "batcher_ttft_prediction_error_ratio_count", engine) or 0) == 2
    assert sample(text, "generated_tokens_total", "static") >= 8  # today's names still count
