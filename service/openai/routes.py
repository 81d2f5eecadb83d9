"""The OpenAI API, one blueprint registered once per engine: `/v1/...` is served by vLLM's
continuous batching, `/static/v1/...` by the static batcher. So the `openai` SDK, and any
benchmark client that speaks the OpenAI API, compares the two engines by its base URL alone.

Only the routes live here, and the shapes in openai_replies.py: bodies are checked by their
models (service/protocol/openai.py) and read by `params`, run by `generation.complete()` or
`generation.Pieces`, as the demo routes run them.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import uuid
from collections.abc import Callable

from flask import Blueprint, Flask, current_app, jsonify, request
from werkzeug.exceptions import NotFound

from batcher.grammar import StructuredSpec
from batcher.sequence import Prompt
from service import batching, context, errors, generation, structured
from service import protocol as bodies
from service.errors import InvalidRequest, ModelNotFound
from service.http import auth, sse
from service.http import body as schema
from service.openai import chat, echo, responses, responses_stream
from service.openai import fields as openai_fields
from service.openai import stream as openai_stream
from service.openai.echo import Echo
from service.openai.replies import ChatShape, TextShape, usage
from service.params import chat_logprobs, parse_n, parse_prompt_logprobs, parse_sampling
from service.protocol.openai import Chat, Completion, Responses
from service.tools import spec as tools
from service.tools.parser import ToolChatShape

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
        generation.engine(request.view_args["engine"]).check_available()


def _config():
    return current_app.config["SERVICE"]


@bp.get("/models")
def models(engine: str):
    config = _config()
    card = {
        "id": config.model_name,
        "object": "model",
        "created": current_app.config["STARTED_AT"],
        "owned_by": "batching-service",
        "root": current_app.extensions["model_path"],
        "max_model_len": config.max_model_len,
        "structured_outputs": structured.SUPPORTED,  # the kinds both engines constrain decoding to
    }
    return jsonify({"object": "list", "data": [card]})


def check_model(body: dict) -> str:
    name = _config().model_name
    asked = body.get("model")
    if asked is not None and asked != name:
        raise ModelNotFound(f"the model '{asked}' does not exist; this service serves '{name}'", param="model")
    return name


def _stream_options(body: dict) -> tuple[bool, bool, bool]:
    """(stream, include_usage, continuous_usage_stats); their types are the route model's."""
    stream, options = bool(body.get("stream")), body.get("stream_options")
    if options is None:
        return stream, False, False
    if not stream:
        raise InvalidRequest("'stream_options' is only allowed with 'stream': true", param="stream_options")
    include_usage, continuous = bool(options.get("include_usage")), bool(options.get("continuous_usage_stats"))
    if continuous and not include_usage:  # vLLM would send no usage at all: say so instead
        message = "'stream_options.continuous_usage_stats' needs 'stream_options.include_usage': true"
        raise InvalidRequest(message, param="stream_options")
    return stream, include_usage, continuous


def _respond(
    shape,
    engine: str,
    model: str,
    prompts: list[Prompt],
    body: dict,
    max_tokens_key: str = "max_tokens",
    echoed: Callable[[list[Prompt]], Echo] | None = None,
    heads: list[str] | None = None,
    tool_grammar: StructuredSpec | None = None,
):
    """Run the prompts (n times each) and answer as one JSON object, or as server-sent chunks
    with `stream`. Choices are grouped per prompt: prompt p's i-th completion has index p*n + i.
    `echoed`: what the request's `echo` puts before each choice, from the prompts as they run;
    `heads`: what service/context.py must keep whole at the start of each prompt (chat);
    `tool_grammar`: the reply's grammar that chat's `tool_choice` asks for (service/tools/spec.py)."""
    stream, include_usage, continuous = _stream_options(body)
    if stream and body.get("details"):  # the batching object rides on whole replies only
        raise InvalidRequest("'details' is not supported with 'stream': true", param="details")
    config = _config()
    params = parse_sampling(  # OpenAI's default temperature
        body, config, default_temperature=1.0, max_tokens_key=max_tokens_key, tool_grammar=tool_grammar
    )
    prompts = context.fit(prompts, body, params.max_tokens, "messages" if heads else "prompt", heads)
    echoed = echoed(prompts) if echoed is not None else None
    echo_asks = echoed.prompt_logprobs(params.logprobs) if echoed is not None else None
    prompt_logprobs = parse_prompt_logprobs(body, echo_asks, stream=stream)
    params = dataclasses.replace(params, prompt_logprobs=prompt_logprobs)
    n = parse_n(body, config)
    want = params.logprobs is not None
    eng = generation.engine(engine)
    head = {"id": f"{shape.prefix}-{uuid.uuid4().hex}", "created": int(time.time()), "model": model}
    if stream:
        pieces = generation.Pieces(eng, prompts, params, n)
        usage_in = (include_usage, continuous)
        chunks = openai_stream.chunks(pieces, shape, {**head, "object": shape.chunk_object}, n, usage_in, want, echoed)
        return sse.response(chunks)
    seqs = generation.complete(eng, prompts, params, n)
    choices = []
    for i, seq in enumerate(seqs):
        text, records = seq.text, seq.logprobs
        if echoed is not None:
            text, records = echoed.text(i // n, text), echoed.logprobs(seq, records)
        choices.append(shape.choice(i, seq, text, records if want else None))
    reply = {**head, "object": shape.object, "choices": choices, "usage": usage(seqs, n), **shape.extras(seqs)}
    if body.get("details"):  # our extension: what batching cost each choice (service/batching.py)
        reply["batching"] = [batching.cost(seq) for seq in seqs]
    return jsonify(reply)


def _body(model, route: str) -> dict:
    """The request's JSON body, every field checked: the refused ones by openai_fields' table,
    the honoured ones by `model` (service/protocol/openai.py)."""
    body = schema.json_body(request)
    openai_fields.check(body, route)
    bodies.validate(model, body, _config())
    return body


@bp.post("/completions")
def completions(engine: str):
    body = _body(Completion, "completions")
    model = check_model(body)
    prompts = schema.completion_prompts(body["prompt"])
    echoed = None
    if body.get("echo"):
        only = body.get("max_tokens") == 0
        if only:  # vLLM: the engine makes one token, and the reply holds the prompt alone
            body = {**body, "max_tokens": 1}
        tokenizer = current_app.extensions["tokenizer"]()
        echoed = functools.partial(echo.for_completions, only=only, tokenizer=tokenizer)
    return _respond(TextShape, engine, model, prompts, body, echoed=echoed)


def chat_prompt(body: dict) -> tuple[str, dict, tools.Tools | None]:
    """(the rendered prompt, the body as the sampling parser reads it, the tools) of a chat
    body: the messages and tools rendered by the chat template; the reply is constrained to a
    call where `tool_choice` asks, by `tools.reply_grammar(tools)`. Chat and Responses both run it."""
    tool_set = tools.parse(body)
    prompt = chat.render(chat.messages(body.get("messages")), tool_set)
    return prompt, tools.constrain(body, tool_set, _config()), tool_set


@bp.post("/chat/completions")
def chat_completions(engine: str):
    body = _body(Chat, "chat")
    model = check_model(body)
    messages = chat.messages(body.get("messages"))
    prompt, body, tool_set = chat_prompt(body)
    # the newer name wins, as on vLLM
    max_tokens_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    top_logprobs = body.get("top_logprobs")
    body = chat_logprobs(body)  # logprobs: true + top_logprobs: k, as the one field the engines read
    echoed = (lambda _: echo.for_chat(messages, top_logprobs)) if body.get("echo") else None
    shape = ToolChatShape(tool_set) if tool_set is not None and tool_set.constrained else ChatShape
    heads = [chat.head(messages, tool_set)]
    grammar = tools.reply_grammar(tool_set)
    return _respond(shape, engine, model, [prompt], body, max_tokens_key, echoed, heads, grammar)


@bp.post("/responses")
def create_response(engine: str):
    """OpenAI's Responses API, stateless, over the chat route's rendering, the same context-length
    rule and the same generation core (service/openai/responses.py)."""
    body = schema.json_body(request)
    asked = responses.check(body)
    bodies.validate(Responses, body, _config())
    model = check_model(body)
    prompt, chat_body, tool_set = chat_prompt(responses.as_chat(body))
    params = parse_sampling(chat_body, _config(), default_temperature=1.0, tool_grammar=tools.reply_grammar(tool_set))
    heads = [chat.head(chat.messages(chat_body.get("messages")), tool_set)]
    prompts = context.fit([prompt], chat_body, params.max_tokens, "input", heads)
    eng = generation.engine(engine)
    head = responses.head(model, asked)
    if body.get("stream"):
        return sse.response(responses_stream.events(generation.Pieces(eng, prompts, params), head, tool_set))
    [seq] = generation.complete(eng, prompts, params)
    return jsonify(responses.whole(head, seq, tool_set))


METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


@bp.route("/", defaults={"unknown": ""}, methods=METHODS, strict_slashes=False)  # the base URL itself too
@bp.route("/<path:unknown>", methods=METHODS)
def unknown_path(engine: str, unknown: str):
    """Any other path under the base URL: 404 in OpenAI's shape (the blueprint's error handler),
    as OpenAI answers it, whichever engine and whether or not it is ready."""
    raise NotFound(f"Invalid URL ({request.method} {request.path})")
