"""Operations: /health, /load and /metrics."""

import resource

from flask import Blueprint, Response, jsonify, request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service.errors import ApiError
from service.http.state import current

bp = Blueprint("ops", __name__)


def _predicted(engines: dict, prompts: int, max_tokens: int) -> dict:
    """Per engine: the predicted wait of a request of that size, as if it came now."""
    return {name: eng.load(prompts, max_tokens) for name, eng in engines.items()}


def health_reply(engines: dict, max_new_tokens: int) -> tuple[dict, int]:
    """/health's body and status code: 200 once the static engine (the one every deployment
    has) is ready; 503 before, and 503 "draining" from SIGTERM on, so that a balancer stops
    sending work at once; 503 "failed" once any engine failed (its load raised, its thread
    raised, or it held work and made no progress for ENGINE_STALL_S), naming it and the error in
    `failed`: the process leaves then, under gunicorn, and a fresh one starts. The probe
    port answers the same body (service/ops/beacon.py publishes it, deploy/probe.py serves it)."""
    body = {name: eng.health() for name, eng in engines.items()}
    for name, load in _predicted(engines, 1, max_new_tokens).items():
        body[name]["predicted"] = load
    ready = body["static"]["status"] == "ready"
    died = {name: eng.error for name, eng in engines.items() if eng.status == "failed"}
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
    return reply, 200 if status == "ok" else 503


@bp.get("/health")
def health():
    """health_reply's, for the app's own engines."""
    state = current()
    reply, code = health_reply(state.engines, state.config.max_new_tokens)
    return jsonify(reply), code


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
    state = current()
    config = state.config
    prompts = _size("prompts", 1, config.max_prompts_per_request)
    max_tokens = _size("max_tokens", config.max_new_tokens, config.max_new_tokens_limit)
    return jsonify({"engines": _predicted(state.engines, prompts, max_tokens)})


def metrics_text(registry) -> bytes:
    """/metrics' body (the probe port's too): Prometheus' text format."""
    return generate_latest(registry)


@bp.get("/metrics")
def metrics():
    return Response(metrics_text(current().metrics.registry), mimetype=CONTENT_TYPE_LATEST)
