"""The app in this process: one of a test's own, a JSON post through a test client, the counters
it exports, and the app behind a real HTTP server on loopback."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator

from flask import Flask
from prometheus_client.parser import text_string_to_metric_families

from service import create_app, shutdown
from service.config import Config
from service.http.state import app_state
from service.ops.health import engine_health


@contextlib.contextmanager
def own_app(**settings) -> Iterator[Flask]:
    """An app of the test's own, from Config's defaults and `settings` (Config's field names),
    eager, its engines ready (vLLM too, unless vllm_enabled=False), shut down after: for a test
    that needs other settings (a short REQUEST_TIMEOUT_S, a tiny queue) or changes the app's
    state, so that no other test's app changes. A fresh engine prices from this machine's profile
    (PROFILE_DIR; `profile_dir` an empty folder: none, so it prices nothing and admits what
    arrives while it is idle whatever the request's size: batcher/engine.py `_admission`)."""
    app = create_app(Config(**{"static_compile": "0", "vllm_enforce_eager": "1", **settings}))
    engines = app_state(app).engines
    try:
        assert engines["static"].wait_ready(60), engine_health(engines["static"])
        if app_state(app).config.vllm_enabled:
            assert engines["vllm"].wait_ready(600), engine_health(engines["vllm"])
        yield app
    finally:
        shutdown(app)


def static_app(**settings) -> contextlib.AbstractContextManager[Flask]:
    """`own_app` with the static engine alone (vLLM disabled): a second or two to start."""
    return own_app(vllm_enabled=False, **settings)


def post(client, path: str, body, headers: dict | None = None):
    """`body` as JSON (a str or bytes as it is) to `path` through a Flask test client."""
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return client.post(path, data=data, content_type="application/json", headers=headers or {})


def prompts_counted(app: Flask, engine: str) -> float:
    """The `prompts` counter: every prompt an engine accepted (a refused request adds none). What a
    request enqueued is the change across it, whatever earlier tests left running."""
    text = app.test_client().get("/metrics").get_data(as_text=True)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "prompts_total" and sample.labels.get("engine") == engine:
                return sample.value
    return 0.0


@contextlib.contextmanager
def over_http(app: Flask) -> Iterator[str]:
    """`app` behind werkzeug's threaded server on a free loopback port: yields "127.0.0.1:PORT"."""
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(30)


def enqueued(app: Flask) -> dict[str, float]:
    """`prompts_counted` of each engine: equal before and after a request, it enqueued nothing,
    whatever earlier tests left running (a stream a client closed is dropped at its next step)."""
    return {name: prompts_counted(app, name) for name in app_state(app).engines}
