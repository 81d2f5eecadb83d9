"""The app's state, one typed object (as vLLM's `app.state`): its settings, its engines, their
metrics and the model's tokenizer, made once by `create_app`. The HTTP layer reads it once per
request (service/http/lookup.py) and hands what a helper needs down as arguments; gunicorn's
hooks and the tests reach it through `app_state(app)`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flask import Flask, current_app

from batcher.engine import EngineThread
from batcher.metrics import Metrics
from service.config import Config

if TYPE_CHECKING:
    from service.http.inflight import InflightGate
    from service.jobs.runner import BatchRunner
    from service.jobs.store import Store
    from service.openai.responses.background import Background
    from service.openai.responses.stored import ResponseStore

KEY = "service"  # its one place in Flask's `app.extensions`


@dataclass
class AppState:
    config: Config
    engines: dict[str, EngineThread]  # "static", "vllm"
    metrics: Metrics
    model_path: str  # the served model's folder (/v1/models' `root`)
    started_at: int  # Unix seconds (/v1/models' `created`)
    load_tokenizer: Callable[[], Any]  # cached: loaded once, at the start (create_app) or on first use
    store: Store | None = None  # files and batch jobs (service/jobs/store.py)
    responses: ResponseStore | None = None  # the Responses API's stored ones, in the store's database
    background: Background | None = None  # runs the background responses (service/openai/responses/background.py)
    runner: BatchRunner | None = None  # runs the batches' lines (service/jobs/runner.py)
    inflight: InflightGate | None = None  # the cap on generate requests (service/http/inflight.py)
    openapi: bytes | None = None  # /openapi.json, built at its first request (service/ops/openapi.py)
    drained: dict[str, tuple[int, int]] | None = None  # set by `shutdown`: per engine, (finished, abandoned)

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer, its chat template too: the same for both engines."""
        return self.load_tokenizer()


def app_state(app: Flask) -> AppState:
    return app.extensions[KEY]


def current() -> AppState:
    """The state of the app serving this request."""
    return app_state(current_app)
