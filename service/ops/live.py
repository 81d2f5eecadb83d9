"""Liveness: GET /livez, for an orchestrator's liveness probe (deploy/kubernetes/)."""

from flask import Blueprint

bp = Blueprint("live", __name__)


@bp.get("/livez")
def livez():
    """200 for as long as the worker accepts and runs a request thread: what a stuck process no
    longer does. It reads no engine state and takes no lock, because /health is readiness: it
    answers 503 while an engine loads, while the worker drains and once an engine failed (the
    worker then leaves by itself, gunicorn.conf.py), and a liveness probe that followed it would
    restart a pod in the middle of its model load or its drain."""
    return "ok\n", 200, {"Content-Type": "text/plain; charset=utf-8"}
