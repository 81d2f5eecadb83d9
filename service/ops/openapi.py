"""`GET /openapi.json`: the API as an OpenAPI 3.1 document, generated from the body models
(each API's protocol.py) and the app's own URL map, so that it lists what is served: each route family
once per engine it is registered for (`/v1` and `/static/v1`, `/tokenize` and
`/static/tokenize`, `/generate` and `/generate_vllm`), never a copied list of paths.

A path's body is its view's model (BODIES); its 4xx responses are the error shape its blueprint
answers in (service/errors.py: OpenAI's where the blueprint has OpenAI's handler, the demo
routes' elsewhere); the bounds that are settings (limits.AtMost) carry this app's values.
"""

from __future__ import annotations

import copy
import functools

from flask import Blueprint, Flask, Response, current_app, jsonify
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from service.demo import protocol as demo
from service.http.state import app_state
from service.openai.batches.protocol import BatchCreate
from service.openai.chat.protocol import Chat
from service.openai.completions.protocol import Completion
from service.openai.responses.protocol import Responses
from service.openai.tokenize.protocol import Detokenize, TokenizeChat, TokenizeText
from service.protocol import limits

bp = Blueprint("openapi", __name__)

REF = "#/components/schemas/{model}"
# each view (the last part of its endpoint) -> its body's model(s)
BODIES: dict[str, tuple[type[BaseModel], ...]] = {
    "generate": (demo.Generate,),
    "basic_generate": (demo.Single,),
    "generate_stream": (demo.Single,),
    "race": (demo.Race,),
    "completions": (Completion,),
    "chat_completions": (Chat,),
    "create_response": (Responses,),
    "tokenize": (TokenizeText, TokenizeChat),  # vLLM's union: `messages` makes it chat
    "detokenize": (Detokenize,),
    "create_batch": (BatchCreate,),
}
STREAMS = {"generate_stream", "race"}  # server-sent events, always
MAY_STREAM = {"completions", "chat_completions", "create_response"}  # with `stream: true`
GETS = {
    "models": "the served model",
    "health": "each engine's state (503 until the static one is ready)",
    "list_files": "this key's files (OpenAI's cursor page: after, limit, order, purpose)",
    "list_batches": "this key's batches, newest first (OpenAI's cursor page: after, limit)",
}
# the routes that name one thing by its id (no body): (method, view) -> what it does
BY_ID = {
    ("get", "retrieve_file"): "the file's object",
    ("get", "file_content"): "the file's bytes as uploaded or written",
    ("delete", "delete_file"): "the file deleted",
    ("get", "retrieve_batch"): "the batch's object",
    ("post", "cancel_batch"): "cancelling: its running lines finish, the rest end cancelled",
    ("get", "retrieve_response"): "a stored response (query: stream, starting_after: a background one's events again)",
    ("delete", "delete_response"): "the stored response deleted",
    ("get", "list_input_items"): "the items it read (OpenAI's cursor page: after, limit, order)",
    ("post", "cancel_response"): "a background response cancelled",
}
# POST /files: a multipart form (Upload's fields and the file, at most MAX_FILE_BYTES)
UPLOAD = {
    "type": "object",
    "properties": {"purpose": {"type": "string", "enum": ["batch"]}, "file": {"type": "string", "format": "binary"}},
    "required": ["purpose", "file"],
}


class DemoError(BaseModel):
    """The demo routes' error: {"error": message, "type": what}."""

    error: str
    type: str
    predicted: dict | None = None  # wait_too_long: the engine's prediction


class OpenAIErrorBody(BaseModel):
    message: str
    type: str  # OpenAI's: invalid_request_error, not_found_error, ...
    param: str | None  # the request field at fault
    code: str | None  # ours: invalid_request, unknown_field, context_length_exceeded, ...


class OpenAIError(BaseModel):
    """OpenAI's error: {"error": {"message", "type", "param", "code"}}."""

    error: OpenAIErrorBody


DEMO_STATUSES = ("400", "401", "413", "422", "429", "503", "504")
OPENAI_STATUSES = ("400", "401", "404", "413", "429", "503", "504")


@functools.cache
def _schemas() -> dict:
    models = {m for ms in BODIES.values() for m in ms} | {DemoError, OpenAIError}
    _, defs = models_json_schema(
        [(m, "validation") for m in sorted(models, key=lambda m: m.__name__)], ref_template=REF
    )
    return defs["$defs"]


def _openai_shaped(app: Flask, blueprint: str) -> bool:
    return Exception in app.error_handler_spec.get(blueprint, {}).get(None, {})


def _operation(endpoint: str, view: str, openai: bool) -> dict:
    responses = _errors(openai)
    ok = ["text/event-stream"] if view in STREAMS else ["application/json"]
    ok += ["text/event-stream"] if view in MAY_STREAM else []
    op = {"operationId": endpoint, "tags": [endpoint.rsplit(".", 1)[0]], "security": [{}, {"bearer": []}]}
    if view in GETS:
        return {**op, "summary": GETS[view], "responses": {"200": {"description": GETS[view]}}}
    models = BODIES[view]
    refs = [{"$ref": REF.format(model=m.__name__)} for m in models]
    schema = refs[0] if len(refs) == 1 else {"oneOf": refs}
    body = {"required": True, "content": {"application/json": {"schema": schema}}}
    ok_content = {kind: {} for kind in ok}
    summary = (models[0].__doc__ or "").strip().split("\n")[0]
    return {
        **op,
        "summary": summary,
        "requestBody": body,
        "responses": {"200": {"description": "OK", "content": ok_content}, **responses},
    }


def _errors(openai: bool) -> dict:
    """The 4xx and 5xx a route answers, in its blueprint's error shape."""
    error, statuses = ("OpenAIError", OPENAI_STATUSES) if openai else ("DemoError", DEMO_STATUSES)
    return {status: {"$ref": f"#/components/responses/{error}"} for status in statuses}


def _by_id(endpoint: str, method: str, view: str, names: list[str], openai: bool) -> dict:
    params = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}} for name in names]
    op = {"operationId": f"{endpoint}.{method}", "tags": [endpoint.rsplit(".", 1)[0]], "security": [{}, {"bearer": []}]}
    ok = {"200": {"description": BY_ID[method, view]}}
    return {**op, "summary": BY_ID[method, view], "parameters": params, "responses": {**ok, **_errors(openai)}}


def _upload(endpoint: str, openai: bool) -> dict:
    op = {"operationId": endpoint, "tags": [endpoint.rsplit(".", 1)[0]], "security": [{}, {"bearer": []}]}
    body = {"required": True, "content": {"multipart/form-data": {"schema": UPLOAD}}}
    summary = "a JSONL file of requests for POST /batches (at most MAX_FILE_BYTES)"
    ok = {"200": {"description": "the file's object"}}
    return {**op, "summary": summary, "requestBody": body, "responses": {**ok, **_errors(openai)}}


def _error(model: str) -> dict:
    return {"description": "an error", "content": {"application/json": {"schema": {"$ref": REF.format(model=model)}}}}


def document(app: Flask) -> dict:
    """The OpenAPI 3.1 document of `app` (its routes, its settings)."""
    paths: dict[str, dict] = {}
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        blueprint, _, view = rule.endpoint.rpartition(".")
        names = sorted(rule.arguments - set(rule.defaults or {}))
        openai = _openai_shaped(app, blueprint)
        if names:
            path = rule.rule.replace("<", "{").replace(">", "}")
            for method in (m.lower() for m in rule.methods if (m.lower(), view) in BY_ID):
                paths.setdefault(path, {})[method] = _by_id(rule.endpoint, method, view, names, openai)
        elif view == "create_file":
            paths.setdefault(rule.rule, {})["post"] = _upload(rule.endpoint, openai)
        elif view in BODIES | GETS:
            method = "post" if view in BODIES else "get"
            if method.upper() in rule.methods:
                paths.setdefault(rule.rule, {})[method] = _operation(rule.endpoint, view, openai)
    schemas = copy.deepcopy(_schemas())  # filled in per app: the cached one stays unfilled
    limits.fill(schemas, app_state(app).config)
    return {
        "openapi": "3.1.0",
        "info": {"title": "batching-service", "version": "1", "description": "docs/api.md and docs/openai.md"},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "responses": {name: _error(name) for name in ("DemoError", "OpenAIError")},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "description": "API_KEY, when set"}},
        },
    }


@bp.get("/openapi.json")
def openapi():
    """Built once per app, at its first request, and kept as bytes: the document deep-copies and
    fills every schema, tens of milliseconds of one thread and the GIL, which an open route that
    anyone may call in a loop must not spend on every call. The app's routes and settings never
    change after start, so neither does it (two first requests at once may both build it; the same
    bytes either way)."""
    state = app_state(current_app)
    if state.openapi is None:
        state.openapi = jsonify(document(current_app)).get_data()
    body = state.openapi
    return Response(body, mimetype="application/json")
