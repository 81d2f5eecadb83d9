"""Operations: /health, /load and /metrics."""

from flask import Blueprint, Response, jsonify, request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service.errors import ApiError
from service.http.state import current
from service.ops.health import health_reply, predicted

bp = Blueprint("ops", __name__)


@bp.get("/health")
def health():
    """health_reply's (service/ops/health.py), for the app's own engines."""
    state = current()
    reply, code = health_reply(state.engines, state.config)
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
    return jsonify({"engines": predicted(state.engines, prompts, max_tokens)})


def metrics_text(registry) -> bytes:
    """/metrics' body (the probe port's too): Prometheus' text format."""
    return generate_latest(registry)


@bp.get("/metrics")
def metrics():
    return Response(metrics_text(current().metrics.registry), mimetype=CONTENT_TYPE_LATEST)
