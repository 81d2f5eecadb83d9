"""Operations: /health and /metrics."""

from flask import Blueprint, Response, current_app, jsonify
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

bp = Blueprint("ops", __name__)


@bp.get("/health")
def health():
    """200 once the static engine (the one every deployment has) is ready; 503 before, and 503
    "draining" from SIGTERM on, so that a balancer stops sending work at once.
    The vLLM engine's state is reported beside it and does not decide the code."""
    engines = current_app.extensions["engines"]
    body = {name: eng.health() for name, eng in engines.items()}
    ready = body["static"]["status"] == "ready"
    if any(eng.draining for eng in engines.values()):
        status = "draining"
    else:
        status = "ok" if ready else "unavailable"
    return jsonify({"status": status, "engines": body}), 200 if status == "ok" else 503


@bp.get("/metrics")
def metrics():
    registry = current_app.extensions["metrics"].registry
    return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)
