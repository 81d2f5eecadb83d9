"""`/batches` under each base URL (service/openai/router.py adds them): storage, so they answer
whatever the engine's state and outside the in-flight cap on generate requests; the batch's
lines run later, on that engine's spare room (service/jobs/)."""

from __future__ import annotations

from flask import jsonify, request

from service.http import lookup
from service.http.body import json_body
from service.openai import storage
from service.openai.batches import serving
from service.openai.batches.protocol import BatchCreate, BatchList
from service.protocol import validate


def create_batch(engine: str):
    req = validate(BatchCreate, json_body(request), lookup.config())
    if lookup.engine(engine).status == "disabled":  # it would never run here: 503, as the online routes
        lookup.engine(engine).check_available()
    store, owner = storage.caller()
    made = serving.create(store, owner, engine, req)
    _wake_runner()
    return jsonify(made)


def list_batches(engine: str):
    query = validate(BatchList, request.args.to_dict(), lookup.config())
    return jsonify(serving.listing(*storage.caller(), query))


def retrieve_batch(engine: str, batch_id: str):
    return jsonify(serving.record(*storage.caller(), batch_id).to_openai())


def cancel_batch(engine: str, batch_id: str):
    cancelled = serving.cancel(*storage.caller(), batch_id)
    _wake_runner()
    return jsonify(cancelled)


def _wake_runner() -> None:
    """A batch to validate or to end: the runner takes its turn now, not at its next tick."""
    runner = lookup.state().runner
    if runner is not None:
        runner.kick()


ROUTES = [
    ("POST", "/batches", create_batch),
    ("GET", "/batches", list_batches),
    ("GET", "/batches/<batch_id>", retrieve_batch),
    ("POST", "/batches/<batch_id>/cancel", cancel_batch),
]
