"""The OpenAI API, one blueprint registered once per engine: `/v1/...` is served by vLLM's
continuous batching, `/static/v1/...` by the static batcher. So the `openai` SDK, and any
benchmark client that speaks the OpenAI API, compares the two engines by its base URL alone.

Only the routes live here, and the shapes in openai_replies.py: requests are parsed by `schema`
and `params`, run by `generation.complete()` or `generation.Pieces`, as the demo routes run them.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator

from flask import Blueprint, Flask, current_app, jsonify, request
from werkzeug.exceptions import NotFound

from batcher.errors import EngineError
from batcher.sequence import Piece, Prompt, Sequence
from service import auth, batching, echo, errors, generation, openai_fields, schema, sse, structured
from service.echo import Echo
from service.errors import ApiError, InvalidRequest, ModelNotFound
from service.openai_replies import ChatShape, TextShape, usage
from service.params import chat_logprobs, parse_n, parse_prompt_logprobs, parse_sampling

bp = auth.protect(Blueprint("openai", __name__))
errors.register_openai(bp)

PREFIXES = {"vllm": "/v1", "static": "/static/v1"}
DONE = sse.event("[DONE]")


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
    """(stream, include_usage, continuous_usage_stats)"""
    stream = schema.flag(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False, False
    if not stream:
        raise InvalidRequest("'stream_options' is only allowed with 'stream': true", param="stream_options")
    if not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object", param="stream_options")
    include_usage = schema.flag(options, "include_usage")
    continuous = schema.flag(options, "continuous_usage_stats")
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
    echoed: Echo | None = None,
):
    """Run the prompts (n times each) and answer as one JSON object, or as server-sent chunks
    with `stream`. Choices are grouped per prompt: prompt p's i-th completion has index p*n + i.
    `echoed`: what the request's `echo` puts before each choice."""
    stream, include_usage, continuous = _stream_options(body)
    if stream and schema.flag(body, "details"):  # the batching object rides on whole replies only
        raise InvalidRequest("'details' is not supported with 'stream': true", param="details")
    config = _config()
    params = parse_sampling(body, config, default_temperature=1.0, max_tokens_key=max_tokens_key)  # OpenAI's
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
        chunks = _chunks(pieces, shape, {**head, "object": shape.chunk_object}, n, usage_in, want, echoed)
        return sse.response(chunks)
    seqs = generation.complete(eng, prompts, params, n)
    choices = []
    for i, seq in enumerate(seqs):
        text, records = seq.text, seq.logprobs
        if echoed is not None:
            text, records = echoed.text(i // n, text), echoed.logprobs(seq, records)
        choices.append(shape.choice(i, seq, text, records if want else None))
    reply = {**head, "object": shape.object, "choices": choices, "usage": usage(seqs, n), **shape.extras(seqs)}
    if schema.flag(body, "details"):  # our extension: what batching cost each choice (service/batching.py)
        reply["batching"] = [batching.cost(seq) for seq in seqs]
    return jsonify(reply)


def _chunks(
    pieces: generation.Pieces,
    shape,
    head: dict,
    n: int,
    usage_in: tuple[bool, bool],
    want: bool,
    echoed: Echo | None = None,
) -> Iterator[str]:
    """One chunk per piece of text, a last one per choice with its finish_reason, the usage chunk
    if asked, then [DONE]; an error after the first byte is an error event, then [DONE].
    With logprobs, each chunk carries those of the tokens generated since the choice's last one.
    `usage_in`: (a usage chunk at the end, usage in every chunk too: that choice's prompt and
    its tokens so far, as vLLM's `continuous_usage_stats`). `echoed`: each choice's first chunk
    starts with its echo (and its prompt's records), as vLLM's; with `echoed.only` the generated
    token is not sent."""
    include_usage, continuous = usage_in
    index = {seq.id: i for i, seq in enumerate(pieces.seqs)}
    sent_records = dict.fromkeys(index, 0)
    sent_chars = dict.fromkeys(index, 0)
    to_echo = set(index) if echoed is not None else set()

    def event(choice: dict, prompt_tokens: int | None, generated: int) -> str:
        if not continuous:
            return sse.event({**head, "choices": [choice]})
        counts = {"prompt_tokens": prompt_tokens, "completion_tokens": generated}
        counts["total_tokens"] = (prompt_tokens or 0) + generated
        return sse.event({**head, "choices": [choice], "usage": counts})

    def chunk(seq: Sequence, text: str, finish_reason: str | None = None) -> str | None:
        records = None
        if want:  # a piece carries its tokens' records; at the end (the sequence done), the rest
            records = list(text.logprobs) if isinstance(text, Piece) else seq.logprobs[sent_records[seq.id] :]
            sent_records[seq.id] += len(records)
        # a piece carries its count; at the end the sequence is done and its own count is final
        generated = text.generated if isinstance(text, Piece) else len(seq.token_ids)
        text = str(text)
        if echoed is not None:
            if seq.id in to_echo:
                to_echo.discard(seq.id)
                text = echoed.text(index[seq.id] // n, text)
                records = echoed.logprobs(seq, records) if want else None
            elif echoed.only:
                if finish_reason is None:
                    return None
                text, records = "", [] if want else None
        choice = shape.delta(index[seq.id], text, records, sent_chars[seq.id], finish_reason)
        sent_chars[seq.id] += len(text)
        return event(choice, seq.prompt_tokens, generated)

    try:
        opened = False
        for seq, text in pieces:
            if not opened:  # the first piece is here: its sequence's prompt is counted (chat: one prompt)
                for choice in shape.opening(len(pieces.seqs)):
                    yield event(choice, seq.prompt_tokens, 0)
                opened = True
            if text is not None:
                out = chunk(seq, text)
            elif seq.error is not None:
                raise seq.error
            else:
                out = chunk(seq, "", seq.finish_reason)
            if out is not None:
                yield out
        if include_usage:
            yield sse.event({**head, "choices": [], "usage": usage(pieces.seqs, n)})
        yield DONE
    except (ApiError, EngineError) as exc:
        yield sse.event(errors.openai_error(exc)[0])
        yield DONE
    finally:
        pieces.close()  # also when the client went away: its sequences stop at their next step


@bp.post("/completions")
def completions(engine: str):
    body = schema.json_body(request)
    openai_fields.check(body, "completions")
    model = check_model(body)
    config = _config()
    prompts = schema.completion_prompts(body.get("prompt"), config)
    echoed = None
    if schema.flag(body, "echo"):
        only = body.get("max_tokens") == 0 and not isinstance(body.get("max_tokens"), bool)
        if only:  # vLLM: the engine makes one token, and the reply holds the prompt alone
            body = {**body, "max_tokens": 1}
        tokenizer = current_app.extensions["tokenizer"]()
        echoed = echo.for_completions(prompts, only, config.max_input_tokens, tokenizer)
    return _respond(TextShape, engine, model, prompts, body, echoed=echoed)


def _message_text(i: int, message) -> dict:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise InvalidRequest(f"'messages[{i}]' must be an object with a 'role'", param="messages")
    content = message.get("content")
    if isinstance(content, list):  # content parts: only text ones have meaning for this model
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise InvalidRequest(f"'messages[{i}].content' parts must be text parts", param="messages")
        content = "".join(part["text"] for part in content)
    if not isinstance(content, str):
        raise InvalidRequest(f"'messages[{i}].content' must be a string or a list of text parts", param="messages")
    return {"role": message["role"], "content": content}


def chat_messages(messages) -> list[dict]:
    """The messages as the chat template reads them: role and text content."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list", param="messages")
    return [_message_text(i, m) for i, m in enumerate(messages)]


def render_chat(messages: list[dict], *, add_generation_prompt: bool = True) -> str:
    """The model's own chat template, the same rendering for both engines (and /tokenize)."""
    tokenizer = current_app.extensions["tokenizer"]()
    if not tokenizer.chat_template:
        raise InvalidRequest("this model has no chat template: use /completions with a prompt", param="messages")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


@bp.post("/chat/completions")
def chat_completions(engine: str):
    body = schema.json_body(request)
    openai_fields.check(body, "chat")
    model = check_model(body)
    messages = chat_messages(body.get("messages"))
    prompt = render_chat(messages)
    # the newer name wins, as on vLLM
    max_tokens_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    top_logprobs = body.get("top_logprobs")
    body = chat_logprobs(body)  # logprobs: true + top_logprobs: k, as the one field the engines read
    echoed = echo.for_chat(messages, top_logprobs) if schema.flag(body, "echo") else None
    return _respond(ChatShape, engine, model, [prompt], body, max_tokens_key, echoed=echoed)


METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


@bp.route("/", defaults={"unknown": ""}, methods=METHODS, strict_slashes=False)  # the base URL itself too
@bp.route("/<path:unknown>", methods=METHODS)
def unknown_path(engine: str, unknown: str):
    """Any other path under the base URL: 404 in OpenAI's shape (the blueprint's error handler),
    as OpenAI answers it, whichever engine and whether or not it is ready."""
    raise NotFound(f"Invalid URL ({request.method} {request.path})")
