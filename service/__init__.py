"""The Flask app factory: settings, engines, blueprints, error handlers."""

from __future__ import annotations

import functools
import logging
import threading
import time

from flask import Flask, g, request

from batcher.checkpoint import resolve_model
from batcher.metrics import Metrics
from batcher.runner import Runner
from batcher.vllm_worker import VLLMWorker
from batcher.worker import ModelWorker
from service import continuous, errors, ops, page, static
from service.config import Config

log = logging.getLogger(__name__)


def create_app(config: Config | None = None, *, start: bool = True) -> Flask:
    """Build the app and start its engines (each loads its model in its own thread).

    `start=False` builds everything but starts no thread (for tests of the app alone)."""
    config = config or Config.from_env()
    app = Flask(__name__)
    app.config["SERVICE"] = config
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    app.json.ensure_ascii = False  # completions are text: keep them readable in curl
    metrics = Metrics()
    model_path = functools.cache(lambda: resolve_model(config.model, config.cache_dir))
    model_lock = threading.Lock()  # static rounds wait while vLLM compiles (see VLLMWorker)

    def load_runner() -> Runner:
        return Runner(model_path(), dtype=config.dtype, device=config.device, max_input_tokens=config.max_input_tokens)

    static_engine = ModelWorker(
        load_runner,
        batch_size=config.batch_size,
        batch_wait_ms=config.batch_wait_ms,
        max_queue=config.max_queue,
        torch_threads=config.torch_threads,
        model_lock=model_lock,
        metrics=metrics,
    )
    vllm_engine = VLLMWorker(
        model_path,
        dtype=config.dtype,
        max_num_seqs=config.vllm_max_num_seqs,
        max_model_len=config.vllm_max_model_len,
        max_input_tokens=config.max_input_tokens,
        kv_cache_gib=config.vllm_kv_cache_gib,
        gpu_memory_utilization=config.vllm_gpu_memory_utilization,
        max_inbox=config.vllm_max_inbox,
        enforce_eager=config.vllm_enforce_eager,
        enabled=config.vllm_enabled,
        context=app.test_request_context,
        model_lock=model_lock,
        metrics=metrics,
    )
    app.extensions["engines"] = {"static": static_engine, "vllm": vllm_engine}
    app.extensions["metrics"] = metrics

    for blueprint in (static.bp, continuous.bp, ops.bp, page.bp):
        app.register_blueprint(blueprint)
    errors.register(app)
    _observe_requests(app, metrics)

    if start:
        static_engine.start()
        vllm_engine.start()
    return app


def shutdown(app: Flask, timeout: float = 30.0) -> None:
    """Stop every engine: no new work, waiting sequences fail with 503, threads joined."""
    for name, eng in app.extensions["engines"].items():
        eng.stop(timeout)
        log.info("%s engine stopped", name)


def begin_shutdown(app: Flask) -> None:
    """Non-blocking first half of `shutdown`, safe in a signal handler: refuse new work and wake
    every waiter now, so in-flight requests answer 503 instead of holding the worker open."""
    for eng in app.extensions["engines"].values():
        eng.stop(timeout=0)


def _observe_requests(app: Flask, metrics: Metrics) -> None:
    @app.before_request
    def _start_clock():
        g.started = time.perf_counter()

    @app.after_request
    def _record(response):
        if request.endpoint and request.endpoint.startswith(("static.", "vllm.")):
            elapsed = time.perf_counter() - g.started
            metrics.request_seconds.labels(request.path, str(response.status_code)).observe(elapsed)
            log.info("%s %s %d %.3fs", request.method, request.path, response.status_code, elapsed)
        return response
