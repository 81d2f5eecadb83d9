"""The Flask app factory: settings, engines, blueprints, error handlers."""

from __future__ import annotations

import functools
import logging
import time

from flask import Flask, g, request

from batcher.checkpoint import resolve_model
from batcher.compile_cache import import_torch_first, use_compile_cache
from batcher.metrics import Metrics
from batcher.vllm.worker import VLLMWorker
from service import errors
from service.config import Config
from service.demo import page
from service.demo import routes as demo_routes
from service.http import admission, inflight, lookup, request_id
from service.http.state import KEY, AppState, app_state
from service.jobs.metrics import BatchCollector
from service.jobs.runner import BatchRunner
from service.jobs.store import Store
from service.openai import router as openai_router
from service.openai.responses.background import Background
from service.openai.responses.stored import ResponseStore
from service.ops import live, openapi
from service.ops import routes as ops_routes
from service.plan import Served

log = logging.getLogger(__name__)

# the routes that run prompts: counted in request_latency_seconds and logged one line each
GENERATE_BLUEPRINTS = set(demo_routes.ROUTES) | openai_router.blueprints("openai")
# the routes the in-flight cap counts: those, and /tokenize, whose chat rendering (up to 1,024
# messages through the template) holds a thread and the GIL as long as a short generation does
CAPPED_BLUEPRINTS = GENERATE_BLUEPRINTS | openai_router.blueprints("tokenize")
# the Files and Batches APIs' routes: storage, outside the cap, and a batch's poll is not a generate request
STORAGE_ENDPOINTS = openai_router.storage_endpoints()


def create_app(config: Config | None = None, *, start: bool = True) -> Flask:
    """Build the app and start its engines (each loads its model in its own thread).

    `start=False` builds everything but starts no thread (for tests of the app alone)."""
    # torch and transformers load here, not at import: deploy/ and batcher.checkpoint's command
    # import `service` for its Config alone. torch before transformers: the compile caches' keys
    # depend on it (batcher/compile_cache.py, `import_torch_first`)
    import_torch_first()
    from transformers import AutoTokenizer

    from batcher.device import openmp_runtime
    from batcher.static.worker import StaticWorker

    config = config or Config.from_env()
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    app.json.ensure_ascii = False  # completions are text: keep them readable in curl
    metrics = Metrics(model_name=config.model_name)
    # Once, before any engine thread starts: two threads resolving at once would each convert
    # the default model on a first run. A no-op once `make setup` has converted it.
    path = resolve_model(config.model, config.cache_dir)
    # every `auto` resolved here, once, into each engine's settings (shown in /health)
    static_settings, vllm_settings = config.static_engine(path), config.vllm_engine(path)
    for name, shown in (("static", static_settings.shown()), ("vllm", vllm_settings.shown())):
        decoding = "eager" if shown.get("enforce_eager", not shown.get("compile")) else "compiled"
        log.info("%s engine: %s %s on %s (%s)", name, shown["dtype"], decoding, shown["device"], shown["reason"])
    if vllm_settings.enabled and vllm_settings.device == "cpu" and openmp_runtime() == "gnu":
        log.warning(
            "OpenMP is GNU's here (Intel's libiomp5 not preloaded): beside vLLM's threads the static engine's rounds "
            "run far slower; `make serve` preloads it (LD_PRELOAD: docs/operations.md, Preloads)"
        )
    use_compile_cache(config.compile_cache_dir, vllm_settings.device)  # before anything compiles

    vllm_engine = VLLMWorker(vllm_settings, context=app.test_request_context, metrics=metrics)
    static_engine = StaticWorker(static_settings, metrics=metrics, serving=vllm_engine.inflight)
    engines = {"static": static_engine, "vllm": vllm_engine}
    store = Store(config.database)
    state = AppState(
        config=config,
        engines=engines,
        metrics=metrics,
        model_path=path,
        started_at=int(time.time()),
        # for chat templates (the same rendering for both engines); loaded at start (below), once
        load_tokenizer=functools.cache(lambda: AutoTokenizer.from_pretrained(path)),
        store=store,
        responses=ResponseStore(store.db, config.response_retention_s),
    )
    app.extensions[KEY] = state
    state.runner = BatchRunner(app, store, config, engines)
    # one heartbeat per process: the batch runner's proves this worker's background runs alive too
    served = lambda: Served(config, state.tokenizer)  # noqa: E731
    state.background = Background(state.responses, state.runner.worker, served, engines)
    metrics.registry.register(BatchCollector(store))  # batch lines and batches, read when scraped

    for blueprint in (ops_routes.bp, live.bp, page.bp, openapi.bp):
        app.register_blueprint(blueprint)
    demo_routes.register(app)
    openai_router.register(app)
    errors.register(app)
    request_id.register(app)  # first of the app's hooks
    _observe_requests(app, metrics)
    # after the hooks a refusal needs; files and batches are storage, outside the cap
    inflight.register(app, config.inflight_limit, CAPPED_BLUEPRINTS, STORAGE_ENDPOINTS)

    if start:
        static_engine.start()
        vllm_engine.start()
        state.runner.start()
        state.background.start()
        state.load_tokenizer()  # while the engines load: not on the first request's path
    return app


def shutdown(app: Flask, timeout: float = 30.0) -> dict[str, tuple[int, int]]:
    """Drain, then stop every engine: no new work (503 `shutting_down`), what is queued or running
    finishes within `timeout`, what is left then fails with 503, threads joined. Returns, per
    engine, (sequences finished, sequences abandoned) since the drain began, and logs them."""
    state = app_state(app)
    if state.drained is not None:  # the second call (worker_exit after the SIGTERM drain)
        return state.drained
    begin_shutdown(app)
    started = time.monotonic()
    deadline = started + timeout
    engines = state.engines
    for eng in engines.values():
        eng.wait_drained(max(0.0, deadline - time.monotonic()))
    state.runner.stop(max(1.0, deadline - time.monotonic()))
    state.background.stop(max(1.0, deadline - time.monotonic()))
    counts = {}
    for name, eng in engines.items():
        eng.stop(max(1.0, deadline - time.monotonic()))
        counts[name] = (eng.held_at_drain - eng.abandoned, eng.abandoned)
    state.drained = counts
    for name, (finished, abandoned) in counts.items():
        log.info(
            "%s engine drained in %.1fs: %d sequences finished, %d abandoned",
            name,
            time.monotonic() - started,
            finished,
            abandoned,
        )
    return counts


def begin_shutdown(app: Flask) -> None:
    """Non-blocking first half of `shutdown`, safe in a signal handler: every engine refuses new
    work from now on (503 `shutting_down`, /health 503 "draining"); what it holds goes on."""
    state = app_state(app)
    state.runner.halt()  # no new batch line; the ones in flight drain with the engines
    state.background.halt()  # no new background run; one the drain cuts goes back to queued
    for eng in state.engines.values():
        eng.begin_drain()


def _observe_requests(app: Flask, metrics: Metrics) -> None:
    @app.before_request
    def _start_clock():
        g.started = time.perf_counter()

    @app.after_request
    def _record(response):
        run = lookup.current_run()
        if request.blueprint in GENERATE_BLUEPRINTS and run is not None and run.predicted is not None:
            response.headers.update(admission.headers(run.predicted))  # also on a refusal
        now = time.perf_counter()
        elapsed, status, rid = now - g.get("started", now), response.status_code, request_id.current()
        if request.endpoint in STORAGE_ENDPOINTS:
            if request.method != "GET":  # an upload, a new batch, a cancel, a delete; not a poll
                log.info("%s %s %d %.3fs request_id=%s", request.method, request.path, status, elapsed, rid)
        elif request.blueprint in GENERATE_BLUEPRINTS:
            # the route's rule, not the path: an unknown path under /v1 must not make a new series
            endpoint = request.url_rule.rule if request.url_rule else request.path
            metrics.request_seconds.labels(endpoint, str(status)).observe(elapsed)
            log.info("%s %s %d %.3fs request_id=%s", request.method, request.path, status, elapsed, rid)
        return response
