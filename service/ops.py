"""Operations: /health and /metrics."""

import resource

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
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux: VmHWM
    reply = {"status": status, "engines": body, "peak_memory_gib": round(peak_gib, 3)}
    return jsonify(reply), 200 if status == "ok" else 503


@bp.get("/metrics")
def metrics():
    registry = current_app.extensions["metrics"].registry
    return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)
