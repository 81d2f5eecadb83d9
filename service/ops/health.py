"""The bodies of /health and /load, built from what each engine reports of itself (its status,
queue, settings, cost model and calibration). One body, two servers of it: the worker's routes
(service/ops/routes.py) and the probe port (service/ops/beacon.py publishes `health_reply`)."""

from __future__ import annotations

import resource

from batcher.engine import EngineThread
from batcher.memory import resident_mib
from batcher.predict import Prediction, Work
from service.config import Config


def load_entry(engine: EngineThread, prompts: int, max_tokens: int) -> dict:
    """/load's entry for one engine: the prediction for `prompts` prompts of `max_tokens` tokens
    (null fields when unknown or not ready) and the estimates it is made of."""
    ready = engine.ready
    prediction = engine.predict([Work(max_tokens)] * prompts) if ready else None
    return {
        "status": engine.status,
        "prompts": prompts,
        "max_tokens": max_tokens,
        **(prediction or Prediction(None, None, None, engine.inflight())).shown(),
        "estimates": {**engine.cost.shown(), "calibration": engine.calibration.shown()},
    }


def predicted(engines: dict[str, EngineThread], prompts: int, max_tokens: int) -> dict:
    """Per engine: the predicted wait of a request of that size, as if it came now."""
    return {name: load_entry(engine, prompts, max_tokens) for name, engine in engines.items()}


def engine_health(engine: EngineThread) -> dict:
    """/health's entry for one engine, before its `predicted`."""
    return {
        "status": engine.status,
        "error": engine.error,
        "load_seconds": engine.load_seconds,
        "phase": engine.phase,
        "phase_seconds": {k: round(v, 2) for k, v in engine.phase_seconds().items()},
        "queued": engine.queued(),
        "running": engine.running(),
        "inflight": engine.inflight(),
        "stalled_s": round(engine.stalled_s(), 1),  # with work held, since the last progress
        "settings": engine.settings.shown(),
        **engine.details(),
    }


def health_reply(engines: dict[str, EngineThread], config: Config) -> tuple[dict, int]:
    """/health's body and status code: 200 once the static engine (the one every deployment
    has) is ready; 503 before, and 503 "draining" from SIGTERM on, so that a balancer stops
    sending work at once; 503 "failed" once any engine failed (its load raised, its thread
    raised, or it held work and made no progress for ENGINE_STALL_S), naming it and the error in
    `failed`: the process leaves then, under gunicorn, and a fresh one starts."""
    body = {name: engine_health(engine) for name, engine in engines.items()}
    for name, load in predicted(engines, 1, config.max_new_tokens).items():
        body[name]["predicted"] = load
    ready = body["static"]["status"] == "ready"
    died = {name: engine.error for name, engine in engines.items() if engine.status == "failed"}
    if died:
        status = "failed"
    elif any(engine.draining for engine in engines.values()):
        status = "draining"
    else:
        status = "ok" if ready else "unavailable"
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux: VmHWM
    now_gib = resident_mib() / 1024  # what the profile's choices were to keep within MEMORY_BUDGET_GIB
    reply = {"status": status, "engines": body, "memory_gib": round(now_gib, 3), "peak_memory_gib": round(peak_gib, 3)}
    reply["memory_budget_gib"] = config.memory_budget_gib
    if died:
        reply["failed"] = died
    return reply, 200 if status == "ok" else 503
