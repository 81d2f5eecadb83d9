"""Operations: /health, /load and /metrics."""

import resource

from flask import Blueprint, Response, current_app, jsonify, request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service.errors import ApiError

bp = Blueprint("ops", __name__)


def _predicted(prompts: int, max_tokens: int) -> dict:
    """Per engine: the predicted wait of a request of that size, as if it came now."""
    return {name: eng.load(prompts, max_tokens) for name, eng in current_app.extensions["engines"].items()}


@bp.get("/health")
def health():
    """200 once the static engine (the one every deployment has) is ready; 503 before, and 503
    "draining" from SIGTERM on, so that a balancer stops sending work at once; 503 "failed" once
    any engine died after it was ready (its thread raised, or it held work and made no progress
    for ENGINE_STALL_S), naming it and the error in `failed`: the process leaves then, under
    gunicorn, and a fresh one starts. A vLLM engine that failed to *start* is reported beside
    the static one and does not decide the code."""
    engines = current_app.extensions["engines"]
    body = {name: eng.health() for name, eng in engines.items()}
    for name, load in _predicted(1, current_app.config["SERVICE"].max_new_tokens).items():
        body[name]["predicted"] = load
    ready = body["static"]["status"] == "ready"
    died = {name: eng.error for name, eng in engines.items() if eng.lifecycle.died}
    if died:
        status = "failed"
    elif any(eng.draining for eng in engines.values()):
        status = "draining"
    else:
        status = "ok" if ready else "unavailable"
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux: VmHWM
    reply = {"status": status, "engines": body, "peak_memory_gib": round(peak_gib, 3)}
    if died:
        reply["failed"] = died
    return jsonify(reply), 200 if status == "ok" else 503


def _size(name: str, default: int, limit: int) -> int:
    raw = request.args.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(f"'{name}' must be an integer, got {raw!r}", param=name) from None
    if not 1 <= value <= limit:
        raise ApiError(f"'{name}' must be in 1..{limit}, got {value}", param=name)
    return value


@bp.get("/load")
def load():
    """Per engine, the predicted queue time, time to first token and completion of a request of
    `?prompts=` prompts (1) of `?max_tokens=` tokens (MAX_NEW_TOKENS), if it came now."""
    config = current_app.config["SERVICE"]
    prompts = _size("prompts", 1, config.max_prompts_per_request)
    max_tokens = _size("max_tokens", config.max_new_tokens, config.max_new_tokens_limit)
    return jsonify({"engines": _predicted(prompts, max_tokens)})


@bp.get("/metrics")
def metrics():
    registry = current_app.extensions["metrics"].registry
    return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)
