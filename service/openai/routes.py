"""The OpenAI API, one blueprint registered once per engine: `/v1/...` is served by vLLM's
continuous batching, `/static/v1/...` by the static batcher. So the `openai` SDK, and any
benchmark client that speaks the OpenAI API, compares the two engines by its base URL alone.

Each view reads its body once into its model (service/protocol/: types, ranges and the rules
that span fields), has its API's module plan it (completion.py, chat.py, responses.py: a frozen
`Plan`), runs the plan through `generation.complete()` or `generation.Pieces` and shapes the
reply (replies.py, stream.py, responses.py).
"""

from __future__ import annotations

import time
import uuid

from flask import Blueprint, Flask, jsonify, request
from pydantic import BaseModel
from werkzeug.exceptions import NotFound

from service import batching, errors, generation, structured
from service.http import auth, lookup, sse
from service.http.body import json_body
from service.openai import chat, completion, fields, responses, responses_stream, stream
from service.openai.replies import ChatShape, TextShape, ToolChatShape, usage
from service.plan import Plan
from service.protocol import validate
from service.protocol.chat import Chat
from service.protocol.completion import Completion
from service.protocol.responses import Responses

bp = auth.protect(Blueprint("openai", __name__))
errors.register_openai(bp)

PREFIXES = {"vllm": "/v1", "static": "/static/v1"}


def register(app: Flask) -> None:
    for engine, prefix in PREFIXES.items():
        app.register_blueprint(bp, name=f"openai_{engine}", url_prefix=prefix, url_defaults={"engine": engine})


@bp.before_request
def _engine_available() -> None:
    """Every route of a loading, failed, disabled or stopping engine answers 503 with the reason."""
    if request.view_args is not None and request.endpoint.rsplit(".", 1)[-1] != unknown_path.__name__:
        lookup.engine(request.view_args["engine"]).check_available()


@bp.get("/models")
def models(engine: str):
    state = lookup.state()
    card = {
        "id": state.config.model_name,
        "object": "model",
        "created": state.started_at,
        "owned_by": "batching-service",
        "root": state.model_path,
        "max_model_len": state.config.max_model_len,
        "structured_outputs": structured.SUPPORTED,  # the kinds both engines constrain decoding to
    }
    return jsonify({"object": "list", "data": [card]})


def _read(model: type[BaseModel], route: str):
    """The request's JSON body as `model`, every field checked once: the refused ones by
    fields.py's table, the honoured ones (and what spans them) by the model."""
    body = json_body(request)
    fields.check(body, route)
    return validate(model, body, lookup.config())


def _respond(shape, engine: str, plan: Plan):
    """Run the plan (its prompts n times each) and answer as one JSON object, or as server-sent
    chunks with `stream`. Choices are grouped per prompt: prompt p's i-th completion has index p*n + i."""
    run = lookup.run(engine, plan.max_queue_ms)
    head = {"id": f"{shape.prefix}-{uuid.uuid4().hex}", "created": int(time.time()), "model": run.config.model_name}
    if plan.stream:
        pieces = generation.Pieces(run, plan.prompts, plan.params, plan.n)
        return sse.response(stream.chunks(pieces, shape, {**head, "object": shape.chunk_object}, plan))
    seqs = generation.complete(run, plan.prompts, plan.params, plan.n)
    choices = []
    for i, seq in enumerate(seqs):
        text, records = seq.text, seq.logprobs
        if plan.echo is not None:
            text, records = plan.echo.text(i // plan.n, text), plan.echo.logprobs(seq, records)
        choices.append(shape.choice(i, seq, text, records if plan.logprobs else None))
    reply = {**head, "object": shape.object, "choices": choices, "usage": usage(seqs, plan.n), **shape.extras(seqs)}
    if plan.details:  # our extension: what batching cost each choice (service/batching.py)
        reply["batching"] = [batching.cost(seq) for seq in seqs]
    return jsonify(reply)


@bp.post("/completions")
def completions(engine: str):
    req = _read(Completion, "completions")
    served = lookup.served()
    served.check_model(req.model)
    return _respond(TextShape, engine, completion.plan(req, served))


@bp.post("/chat/completions")
def chat_completions(engine: str):
    req = _read(Chat, "chat")
    served = lookup.served()
    served.check_model(req.model)
    plan = chat.plan(req, served)
    shape = ToolChatShape(plan.tools) if plan.tools is not None and plan.tools.constrained else ChatShape
    return _respond(shape, engine, plan)


@bp.post("/responses")
def create_response(engine: str):
    """OpenAI's Responses API, stateless, over the chat route's rendering, the same context-length
    rule and the same generation core (service/openai/responses.py)."""
    body = responses.check(json_body(request))
    served = lookup.served()
    req = validate(Responses, body, served.config)
    head = responses.head(served.check_model(req.model), req)
    plan = responses.plan(req, served)
    run = lookup.run(engine)
    if plan.stream:
        return sse.response(
            responses_stream.events(generation.Pieces(run, plan.prompts, plan.params), head, plan.tools)
        )
    [seq] = generation.complete(run, plan.prompts, plan.params)
    return jsonify(responses.whole(head, seq, plan.tools))


METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


@bp.route("/", defaults={"unknown": ""}, methods=METHODS, strict_slashes=False)  # the base URL itself too
@bp.route("/<path:unknown>", methods=METHODS)
def unknown_path(engine: str, unknown: str):
    """Any other path under the base URL: 404 in OpenAI's shape (the blueprint's error handler),
    as OpenAI answers it, whichever engine and whether or not it is ready."""
    raise NotFound(f"Invalid URL ({request.method} {request.path})")
