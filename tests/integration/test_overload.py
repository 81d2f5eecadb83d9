"""Overload (issue 41): past MAX_INFLIGHT_REQUESTS a generate request is refused at once (429
`too_busy`, Retry-After), every slot it held comes back however it ended, and /health and
/metrics answer while the cap is full: the app through Flask's test client (the static engine
alone, real model). A real gunicorn flooded over loopback: tests/e2e/test_overload.py."""

from __future__ import annotations

import threading

import pytest

from service import GENERATE_BLUEPRINTS, create_app
from service.config import Config
from service.http.inflight import OTHER_ENDPOINTS
from service.http.state import app_state
from service.openai import router as openai_router
from tests.helpers.apps import static_app

CAP = 2  # the test client's app: two generate requests in flight, then 429
LONG = {"max_tokens": 200, "ignore_eos": True}  # a stream that is still running when the test closes it


@pytest.fixture(scope="module")
def gated():
    with static_app(threads=4, max_inflight_requests=CAP, torch_threads=1) as app:
        yield app


def prompt_routes(app) -> list[tuple[str, bool]]:
    """(path, answers in OpenAI's shape) of every route that runs prompts, as the app maps them."""
    routes = []
    for rule in app.url_map.iter_rules():
        blueprint = rule.endpoint.partition(".")[0]
        runs = (blueprint in GENERATE_BLUEPRINTS and "POST" in rule.methods) or rule.endpoint in OTHER_ENDPOINTS
        runs = runs and rule.endpoint not in openai_router.storage_endpoints()  # files and batches: storage
        if runs and not rule.endpoint.endswith(".unknown_path"):  # /v1's 404 for a path it lacks
            routes.append((rule.rule, blueprint.startswith("openai_")))
    return routes


class HeldStream:
    """A stream opened in a thread of its own, as gunicorn serves each, and held open unread until
    `close()` (Flask's test client would leave an iterated stream's context on a shared thread)."""

    def __init__(self, app, path: str, body: dict):
        self.status: int | None = None
        self._opened, self._closing = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._hold, args=(app, path, body))
        self._thread.start()
        assert self._opened.wait(300), f"{path} did not open"

    def _hold(self, app, path: str, body: dict) -> None:
        try:
            response = app.test_client().post(path, json=body, buffered=False)
            self.status = response.status_code
        finally:
            self._opened.set()
        self._closing.wait(600)
        response.close()  # what gunicorn does when the stream ends or its client goes away

    def close(self) -> None:
        self._closing.set()
        self._thread.join(60)


def test_past_the_cap_every_prompt_route_is_refused_at_once_and_the_probes_answer(gated):
    client, model = gated.test_client(), app_state(gated).config.model_name
    short = {"max_tokens": 8}  # a stream holds its slot until it is closed, read or not, finished or not
    held = [
        HeldStream(gated, "/generate_stream", {"prompt": "Tell me a long story", **short}),
        HeldStream(gated, "/static/v1/completions", {"model": model, "prompt": "Once upon", "stream": True, **short}),
    ]
    try:
        assert [h.status for h in held] == [200, 200]
        routes = prompt_routes(gated)
        assert len(routes) >= 12 and ("/race", False) in routes and ("/static/v1/responses", True) in routes
        for path, openai_shape in routes:
            r = client.post(path, json={"prompts": ["a"], "prompt": "a", "model": model, "engine": "static"})
            assert r.status_code == 429, (path, r.status_code, r.get_data(as_text=True)[:300])
            assert r.headers["Retry-After"] == "1"
            if openai_shape:
                error = r.json["error"]
                assert (error["code"], error["type"]) == ("too_busy", "rate_limit_error"), (path, r.json)
            else:
                assert r.json["type"] == "too_busy" and "MAX_INFLIGHT_REQUESTS" in r.json["error"], (path, r.json)
        for probe in ("/health", "/metrics", "/load", "/static/v1/models"):
            assert client.get(probe).status_code == 200, probe
        tokenized = client.post("/static/tokenize", json={"model": model, "prompt": "a"})
        assert tokenized.status_code == 429  # a chat to render holds a thread too: gated
        gate = app_state(gated).inflight
        assert gate.held == CAP  # a refusal takes no slot

        held.pop().close()
        assert gate.held == CAP - 1
        r = client.post("/generate", json={"prompts": ["The capital of France is"], "max_tokens": 2})
        assert r.status_code == 200 and gate.held == CAP - 1  # admitted again, and given back
    finally:
        for h in held:
            h.close()
    assert app_state(gated).inflight.held == 0


def test_a_wrong_or_missing_key_is_a_401_even_while_the_cap_is_full():
    """No retry makes a request without the key succeed, so it is never told to retry (429)."""
    app = create_app(Config(vllm_enabled=False, api_key="the-key", max_inflight_requests=1, threads=4), start=False)
    client, held = app.test_client(), app_state(app).inflight.try_enter()  # the cap, full
    try:
        for path, openai in prompt_routes(app):
            for headers in ({}, {"Authorization": "Bearer not-the-key"}):
                r = client.post(path, json={}, headers=headers)
                assert r.status_code == 401, (path, headers, r.status_code, r.get_data(as_text=True))
                assert "Retry-After" not in r.headers
            r = client.post(path, json={}, headers={"Authorization": "Bearer the-key"})
            assert r.status_code == 429 and r.headers["Retry-After"], (path, r.get_data(as_text=True))
            error = r.json["error"]
            assert (error["code"] if openai else r.json["type"]) == "too_busy", (path, r.json)
    finally:
        held.release()


@pytest.mark.parametrize("path", ["/tokenize", "/static/tokenize", "/detokenize"])
def test_tokenize_counts_under_the_cap_as_the_generate_routes_do(path):
    """A 1,024-message chat to render holds a thread as a generation does: past the cap, 429."""
    app = create_app(Config(vllm_enabled=False, max_inflight_requests=1, threads=4), start=False)
    held = app_state(app).inflight.try_enter()  # the cap, full
    try:
        r = app.test_client().post(path, json={"prompt": "Hi"})
        assert r.status_code == 429 and r.json["error"]["code"] == "too_busy", r.get_data(as_text=True)
    finally:
        held.release()
    assert app_state(app).inflight.held == 0


def test_following_a_background_responses_events_counts_under_the_cap(tmp_path):
    """`GET /responses/{id}?stream=true` holds a thread until the response ends: past the cap, 429;
    the same GET without `stream` is storage, answered whatever the cap."""
    config = Config(vllm_enabled=False, max_inflight_requests=1, threads=4, data_dir=str(tmp_path))
    app = create_app(config, start=False)
    held = app_state(app).inflight.try_enter()  # the cap, full
    try:
        client = app.test_client()
        for flag in ("true", "1", "True"):
            r = client.get(f"/static/v1/responses/resp_x?stream={flag}")
            assert r.status_code == 429 and r.json["error"]["code"] == "too_busy", r.get_data(as_text=True)
        assert client.get("/static/v1/responses/resp_x").status_code == 404
        assert client.get("/static/v1/responses/resp_x?stream=false").status_code == 404
    finally:
        held.release()


@pytest.mark.parametrize(
    "path, body, status",
    [
        ("/generate", {"prompts": ["Hi"], "max_tokens": 2}, 200),
        ("/static/v1/completions", {"prompt": "Hi", "max_tokens": 2}, 200),
        ("/generate_stream", {"prompt": "Hi", "max_tokens": 3}, 200),  # read to its end
        ("/static/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}, 200),
        ("/generate", {"prompts": "not a list"}, 422),  # the view's own error
        ("/static/v1/completions", {"prompt": "Hi", "max_tokens": -1}, 400),
        ("/generate_vllm", {"prompts": ["Hi"]}, 503),  # the engine's error: vLLM is off
        ("/race", {"engine": "static", "prompts": ["Hi"], "max_tokens": 2}, 200),
    ],
)
def test_a_reply_or_an_error_gives_its_slot_back(gated, path, body, status):
    if "/v1/" in path:
        body = {"model": app_state(gated).config.model_name, **body}
    r = gated.test_client().post(path, json=body, buffered=True)  # read to its end and closed, as a server does
    assert r.status_code == status, r.get_data(as_text=True)[:300]
    assert app_state(gated).inflight.held == 0


@pytest.mark.parametrize("path", ["/generate_stream", "/static/v1/completions"])
def test_a_stream_holds_its_slot_until_it_is_closed_after_its_first_event(gated, path):
    gate = app_state(gated).inflight
    body = {"prompt": "Tell me a long story", **LONG}
    if path.startswith("/static/v1"):
        body |= {"model": app_state(gated).config.model_name, "stream": True}
    r = gated.test_client().post(path, json=body, buffered=False)
    try:
        assert r.status_code == 200 and gate.held == 1  # the view has returned; the stream holds on
        assert next(iter(r.response)).startswith(b"data: ")
        assert gate.held == 1
    finally:
        r.close()  # the client went away
    assert gate.held == 0


def test_the_cap_lies_below_threads_and_defaults_to_threads_less_the_probes_share():
    assert Config(threads=16).inflight_limit == 8 and Config().inflight_limit == 120
    assert Config(threads=16, max_inflight_requests=15).inflight_limit == 15
    for bad in ({"threads": 16, "max_inflight_requests": 16}, {"threads": 8}, {"max_inflight_requests": -1}):
        with pytest.raises(ValueError, match="MAX_INFLIGHT_REQUESTS"):
            Config.from_env(**bad)  # worded as the start's check says it
