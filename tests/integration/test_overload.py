"""Overload (issue 41): past MAX_INFLIGHT_REQUESTS a generate request is refused at once (429
`too_busy`, Retry-After), every slot it held comes back however it ended, and /health and
/metrics answer while the cap is full. First the app through Flask's test client (the static
engine alone, real model); then a real gunicorn with few THREADS, flooded over loopback."""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from service import GENERATE_BLUEPRINTS, create_app
from service.config import Config
from service.inflight import OTHER_ENDPOINTS
from tests.helpers.apps import static_app
from tests.helpers.servers import serving

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
    client, model = gated.test_client(), gated.config["SERVICE"].model_name
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
        assert tokenized.status_code == 200  # runs no prompt: not gated
        gate = gated.extensions["inflight"]
        assert gate.held == CAP  # a refusal takes no slot

        held.pop().close()
        assert gate.held == CAP - 1
        r = client.post("/generate", json={"prompts": ["The capital of France is"], "max_tokens": 2})
        assert r.status_code == 200 and gate.held == CAP - 1  # admitted again, and given back
    finally:
        for h in held:
            h.close()
    assert gated.extensions["inflight"].held == 0


def test_a_wrong_or_missing_key_is_a_401_even_while_the_cap_is_full():
    """No retry makes a request without the key succeed, so it is never told to retry (429)."""
    app = create_app(Config(vllm_enabled=False, api_key="the-key", max_inflight_requests=1, threads=4), start=False)
    client, held = app.test_client(), app.extensions["inflight"].try_enter()  # the cap, full
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
        body = {"model": gated.config["SERVICE"].model_name, **body}
    r = gated.test_client().post(path, json=body, buffered=True)  # read to its end and closed, as a server does
    assert r.status_code == status, r.get_data(as_text=True)[:300]
    assert gated.extensions["inflight"].held == 0


@pytest.mark.parametrize("path", ["/generate_stream", "/static/v1/completions"])
def test_a_stream_holds_its_slot_until_it_is_closed_after_its_first_event(gated, path):
    gate = gated.extensions["inflight"]
    body = {"prompt": "Tell me a long story", **LONG}
    if path.startswith("/static/v1"):
        body |= {"model": gated.config["SERVICE"].model_name, "stream": True}
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
            Config(**bad)


# --- a real gunicorn, flooded ----------------------------------------------------------------
THREADS = 16  # gunicorn's, for the flood: small, so that a bounded flood is past it
CLIENTS = 3 * THREADS  # concurrent senders, each one connection at a time
TRIES = 8  # requests a sender sends at most (a refused one waits Retry-After, then tries again)
PROBES = 20  # /health and /metrics, in turn, once every sender has sent
PROBE_TIMEOUT_S = 10  # the promise is a second; this only bounds a probe that never answers
FLOOD_TOKENS = 32  # a round of these holds its requests for seconds (one torch thread)
REFUSALS = {"too_busy", "queue_full", "wait_too_long"}  # 429s with a reason


def flood_request(i: int) -> tuple[str, dict]:
    """Every kind of prompt route in turn: demo and OpenAI, plain and streamed."""
    text = {"max_tokens": FLOOD_TOKENS, "ignore_eos": True}
    model = {"model": Config().model_name}
    return [
        ("/generate", {"prompts": [f"Story {i}"], **text}),
        ("/generate_stream", {"prompt": f"Story {i}", **text}),
        ("/static/v1/completions", {"prompt": f"Story {i}", **model, **text}),
        ("/static/v1/completions", {"prompt": f"Story {i}", "stream": True, **model, **text}),
        ("/static/v1/chat/completions", {"messages": [{"role": "user", "content": f"Story {i}"}], **model, **text}),
    ][i % 5]


def refusal_type(r: requests.Response) -> str | None:
    if r.status_code != 429:
        return None
    error = r.json()["error"]
    return error["code"] if isinstance(error, dict) else r.json()["type"]


def test_a_flood_past_threads_is_refused_at_once_while_the_probes_answer(tmp_path):
    env = {"VLLM_ENABLED": "0", "THREADS": str(THREADS), "TORCH_THREADS": "1", "REQUEST_TIMEOUT_S": "3600"}
    cap = Config(threads=THREADS).inflight_limit
    with serving(tmp_path, env, ready=("static",), disabled=("vllm",)) as srv:
        url, lock, stop, all_sent = srv.url, threading.Lock(), threading.Event(), threading.Event()
        for i in range(5):  # each route once, short: what a first request loads (the tokenizer, ...) is loaded
            path, body = flood_request(i)
            assert requests.post(f"{url}{path}", json={**body, "max_tokens": 2}, timeout=300).status_code == 200
        answers: list[tuple[float, int, str | None, str | None]] = []  # (answered at, status, 429 type, Retry-After)
        failures: list[str] = []
        first_sent = 0

        def sender(k: int) -> None:
            nonlocal first_sent
            for attempt in range(TRIES):
                if stop.is_set():
                    return
                path, body = flood_request(k * TRIES + attempt)
                if attempt == 0:
                    with lock:
                        first_sent += 1
                        if first_sent == CLIENTS:
                            all_sent.set()
                try:
                    r = requests.post(f"{url}{path}", json=body, timeout=(10, 300))
                except requests.RequestException as e:  # lost or hanging: the test fails on it
                    failures.append(f"{path}: {e!r}")
                    return
                with lock:
                    answers.append((time.monotonic(), r.status_code, refusal_type(r), r.headers.get("Retry-After")))
                if r.status_code == 429:
                    stop.wait(float(r.headers.get("Retry-After", 1)))  # as a polite client waits

        probes: list[tuple[str, float, int | str, int | None]] = []  # (path, seconds, status, static inflight)
        with ThreadPoolExecutor(CLIENTS) as pool:
            senders = [pool.submit(sender, k) for k in range(CLIENTS)]
            assert all_sent.wait(120), "the senders did not start"
            window = time.monotonic()
            # the worker's own probes, and the probe server's (deploy/probe.py), which answers
            # what the worker last published from a process of its own
            targets = [f"{base}{p}" for base in (url, srv.probe_url) for p in ("/health", "/metrics")]
            for i in range(PROBES):
                path = targets[i % len(targets)]
                started = time.monotonic()
                try:
                    r = requests.get(path, timeout=PROBE_TIMEOUT_S)
                    inflight = r.json()["engines"]["static"]["inflight"] if path.endswith("/health") else None
                    probes.append((path, time.monotonic() - started, r.status_code, inflight))
                except requests.RequestException as e:
                    probes.append((path, time.monotonic() - started, type(e).__name__, None))
                stop.wait(0.1)  # spread the probes over the flood
            window_end = time.monotonic()
            stop.set()
            for f in senders:
                f.result(timeout=600)

        seconds = sorted(s for _, s, _, _ in probes)
        print(
            f"\nflood: {len(answers)} answers ({sum(a[1] == 200 for a in answers)} 200,"
            f" {sum(a[1] == 429 for a in answers)} 429) from {CLIENTS} senders, THREADS {THREADS}, cap {cap};"
            f" {PROBES} probes: median {statistics.median(seconds) * 1000:.0f} ms,"
            f" max {seconds[-1] * 1000:.0f} ms, static inflight seen {[p[3] for p in probes if p[3] is not None]}"
        )
        print("probes (path, seconds, status, inflight):", [(p, round(t, 3), st, n) for p, t, st, n in probes])
        # every probe answered while the flood was past THREADS (a 503 would be a documented one);
        # the probe server's said what the worker is: ready, and busy (it saw work in flight)
        assert all(status in (200, 503) for _, _, status, _ in probes), probes
        from_probe_server = [(p, st, n) for p, _, st, n in probes if p.startswith(srv.probe_url)]
        assert from_probe_server and all(st == 200 for _, st, _ in from_probe_server), from_probe_server
        assert any(n for p, _, n in from_probe_server if p.endswith("/health")), from_probe_server
        # and the cap was full meanwhile: refusals came back inside the probes' window
        assert any(window <= at <= window_end and status == 429 for at, status, _, _ in answers), (window, answers)
        # every flood request answered: 200, or 429 with a reason and Retry-After; none lost
        assert not failures, failures
        for _, status, reason, retry_after in answers:
            assert status == 200 or (status == 429 and reason in REFUSALS and retry_after), (status, reason)

        # recovery: an ordinary request is admitted once the flood is over
        r = requests.post(
            f"{url}/generate", json={"prompts": ["The capital of France is"], "max_tokens": 2}, timeout=300
        )
        assert r.status_code == 200, r.text
