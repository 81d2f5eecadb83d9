"""The race page's routes through Flask's test client: GET / and the POST /race feed."""

import json
import re
import threading

import pytest

from service import begin_shutdown, create_app
from service.config import Config
from service.http.state import app_state
from tests.helpers.apps import post, static_app


def feed(response) -> list[dict]:
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.mimetype == "text/event-stream"
    chunks = response.get_data(as_text=True).split("\n\n")
    return [json.loads(c.removeprefix("data: ")) for c in chunks if c.strip()]


def by_index(events: list[dict]) -> dict[int, list[dict]]:
    rows: dict[int, list[dict]] = {}
    for event in events:
        if "index" in event:
            rows.setdefault(event["index"], []).append(event)
    return rows


def test_the_page_is_served_with_its_controls_and_nothing_from_outside(client):
    r = client.get("/")
    assert r.status_code == 200 and r.mimetype == "text/html"
    html = r.get_data(as_text=True)
    for name in ("prompts", "n", "max_tokens", "ignore_eos", "engine", "mode", "order"):
        assert f'name="{name}"' in html
    assert 'data-engine="static"' in html and 'data-engine="vllm"' in html and 'data-state="idle"' in html
    assert not re.search(r'(src|href)="(https?:)?//', html)  # no CDN, no other host
    for asset in re.findall(r'(?:src|href)="(/static/[^"]+)"', html):
        assert client.get(asset).status_code == 200, asset
    assert "\na\nb\nc\nd\ne\nf" in html.replace('spellcheck="false">', "\n")  # the write-up's six prompts


def test_the_browsers_own_favicon_request_is_a_204_not_a_404(client):
    # a document without our <link rel="icon"> (/health's JSON) makes the browser ask for it: a 404
    # there reached the page tests' console check when it came after they had emptied the log
    r = client.get("/favicon.ico")
    assert r.status_code == 204 and r.get_data() == b""


@pytest.mark.parametrize(
    "body, status",
    [
        ({"engine": "gpu", "prompts": ["a"]}, 422),
        ({"engine": "static", "mode": "sideways", "prompts": ["a"]}, 422),
        ({"engine": ["static"], "prompts": ["a"]}, 422),
        ({"engine": "static", "mode": {}, "prompts": ["a"]}, 422),
        ({"engine": "static", "prompts": "a"}, 422),
        ({"engine": "static", "prompts": ["a"], "max_tokens": 0}, 422),
        ({"engine": "static", "prompts": ["a"] * 17}, 413),
        ("{not json", 400),
    ],
)
def test_bad_race_requests_get_a_clear_4xx_and_run_nothing(app, client, body, status):
    rounds = app_state(app).engines["static"].rounds
    r = post(client, "/race", body)
    assert r.status_code == status and r.json["error"] and r.json["type"]
    assert app_state(app).engines["static"].rounds == rounds


@pytest.mark.parametrize("engine", ["static", "vllm"])
def test_concurrent_race_streams_each_prompt_with_its_round_then_tokens(vllm_client, engine):
    prompts = ["The capital of France is", "Hi", "def fibonacci(n):"]
    events = feed(post(vllm_client, "/race", {"engine": engine, "prompts": prompts, "max_tokens": 4}))
    assert events[-1] == {"race_done": True}
    rows = by_index(events)
    assert sorted(rows) == [0, 1, 2]
    for evts in rows.values():
        assert evts[0]["sent"] is True and "round" in evts[1] and "token" in evts[2] and evts[-1]["done"] is True
        assert [e["t_ms"] for e in evts] == sorted(e["t_ms"] for e in evts)  # one clock, in order
        if engine == "static":
            assert isinstance(evts[1]["round"], int) and evts[1]["batch_shape"][0] == evts[1]["batch_size"]
        else:
            assert evts[1]["round"].startswith("step-")
    paris = "".join(e.get("token", "") for e in rows[0])
    assert paris.startswith(" Paris")


def test_one_request_race_runs_six_prompts_as_rounds_of_four_and_two(client):
    prompts = list("abcdef")
    events = feed(post(client, "/race", {"engine": "static", "mode": "batch", "prompts": prompts, "max_tokens": 3}))
    rows = by_index(events)
    done = [rows[i][-1] for i in range(6)]
    assert all(rows[i][0]["sent"] is True for i in range(6)) and all(d["done"] for d in done)
    rounds = [d["round"] for d in done]
    assert rounds == [rounds[0]] * 4 + [rounds[0] + 1] * 2
    assert all(d["tokens"] <= 3 and d["inference_ms"] > 0 for d in done)


def test_a_race_on_an_engine_that_is_not_ready_answers_503():
    app = create_app(Config(vllm_enabled=False), start=False)  # no thread started: static is loading
    for engine, state in (("vllm", "disabled"), ("static", "loading")):
        r = post(app.test_client(), "/race", {"engine": engine, "prompts": ["a"]})
        assert r.status_code == 503 and r.json["type"] == "engine_unavailable" and state in r.json["error"]


def test_the_race_checks_the_api_key_once_before_anything_else():
    app = create_app(Config(vllm_enabled=False, api_key="race-key"), start=False)
    body = {"engine": "static", "prompts": ["a"]}
    none = post(app.test_client(), "/race", body)
    assert none.status_code == 401 and none.json["type"] == "invalid_api_key"
    keyed = app.test_client().post("/race", json=body, headers={"Authorization": "Bearer race-key"})
    assert keyed.status_code == 503 and keyed.json["type"] == "engine_unavailable"  # past the key: the engine


@pytest.fixture
def static_only_app():
    # a deadline that a feed waiting on held rounds would reach, were it not ended by the drain
    with static_app(request_timeout_s=60) as app:
        yield app


def test_a_drain_ends_the_feed_with_an_error_per_open_row_in_the_requests_own_thread(static_only_app, held_rounds):
    engine = app_state(static_only_app).engines["static"]
    threads_before = set(threading.enumerate())
    body = {"engine": "static", "prompts": ["a", "b", "c"], "max_tokens": 50, "ignore_eos": True}
    reply = static_only_app.test_client().post("/race", json=body, buffered=False)
    assert reply.status_code == 200
    chunks = (json.loads(c.decode().removeprefix("data: ")) for c in reply.response if c.strip())
    sent = [next(chunks) for _ in body["prompts"]]
    assert [e["index"] for e in sent] == [0, 1, 2] and all(e["sent"] for e in sent)
    # the rounds are held: every prompt is submitted and none has entered; no thread per prompt
    assert set(threading.enumerate()) - threads_before == set()
    begin_shutdown(static_only_app)
    rest = list(chunks)  # the old feed waited here for the deadline, then ended each row with a 504
    assert rest[-1] == {"race_done": True}
    rows = by_index(rest)
    assert sorted(rows) == [0, 1, 2]
    assert all(evts[-1]["type"] == "shutting_down" and evts[-1]["status"] == 503 for evts in rows.values())
    reply.close()
    held_rounds()  # the feed cancelled its sequences: the held round drops them, the drain ends
    assert engine.wait_drained(60) and engine.inflight() == 0
