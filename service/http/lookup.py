"""What a view looks up in the app, once per request, to hand down as arguments: the settings and
the tokenizer (`served`), an engine, and the request's `Run` (its engine and deadlines). Besides
the views and the app's request hooks, this is the one module that reads Flask's globals: the
helpers the views call take what they need as arguments."""

from __future__ import annotations

from flask import g, request

from batcher.sequence import Priority
from service.config import Config
from service.generation import Engine, Run
from service.http import admission
from service.http.state import AppState, current
from service.jobs.runner import BATCH_LINE
from service.plan import Served


def state() -> AppState:
    return current()


def config() -> Config:
    return current().config


def served() -> Served:
    state = current()
    return Served(state.config, state.tokenizer)


def engine(name: str) -> Engine:
    return current().engines[name]


def run(engine_name: str, max_queue_ms: float | None = None) -> Run:
    """The request's way to `engine_name`: its deadlines from REQUEST_TIMEOUT_S, X-Max-Queue-Ms and
    the body's `max_queue_ms`; a batch line's at the lowest priority. Kept for the request
    (`current_run`) so that the reply carries what the engine predicted, a refusal too."""
    settings = config()
    max_ttft_s = admission.max_ttft_s(request.headers, max_queue_ms)
    priority = Priority.BATCH if batch_line() else Priority.INTERACTIVE
    g.run = Run(engine(engine_name), settings.request_timeout_s, max_ttft_s, settings, priority)
    return g.run


def batch_line() -> bool:
    """Whether this request is a batch line, run by the service itself (BATCH_LINE)."""
    return request.environ.get(BATCH_LINE) is True


def current_run() -> Run | None:
    return g.get("run")
