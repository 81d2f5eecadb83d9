"""The OpenAI API, one blueprint registered once per engine: `/v1/...` is served by vLLM's
continuous batching, `/static/v1/...` by the static batcher. So the `openai` SDK, and any
benchmark client that speaks the OpenAI API, compares the two engines by its base URL alone.

Only the shapes live here: requests are parsed by `schema` and `params`, run by
`completion.complete()` or `completion.Pieces`, exactly as the demo routes run them.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator

from flask import Blueprint, Flask, current_app, jsonify, request

from batcher.errors import EngineError
from batcher.sequence import Sequence, TokenLogprob
from service import auth, completion, errors, schema, structured
from service.errors import ApiError, InvalidRequest, ModelNotFound
from service.params import chat_logprobs, parse_n, parse_sampling

bp = auth.protect(Blueprint("openai", __name__))
errors.register_openai(bp)

PREFIXES = {"vllm": "/v1", "static": "/static/v1"}
DONE = "data: [DONE]\n\n"


def register(app: Flask) -> None:
    for engine, prefix in PREFIXES.items():
        app.register_blueprint(bp, name=f"openai_{engine}", url_prefix=prefix, url_defaults={"engine": engine})


@bp.before_request
def _engine_available() -> None:
    """Every route of a loading, failed, disabled or stopping engine answers 503 with the reason."""
    if request.view_args is not None:
        completion.engine(request.view_args["engine"]).check_available()


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
        # the longest sequence a request can make: prompts keep their last MAX_INPUT_TOKENS
        "max_model_len": config.max_input_tokens + config.max_new_tokens_limit,
        "structured_outputs": structured.SUPPORTED,  # the kinds both engines constrain decoding to
    }
    return jsonify({"object": "list", "data": [card]})


def _check_model(body: dict) -> str:
    name = _config().model_name
    asked = body.get("model")
    if asked is not None and asked != name:
        raise ModelNotFound(f"the model '{asked}' does not exist; this service serves '{name}'", param="model")
    return name


def _stream_options(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage)"""
    stream = schema.flag(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise InvalidRequest("'stream_options' is only allowed with 'stream': true", param="stream_options")
    if not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object", param="stream_options")
    return stream, schema.flag(options, "include_usage")


def _usage(seqs: list[Sequence]) -> dict:
    prompt = sum(seq.prompt_tokens or 0 for seq in seqs)
    generated = sum(len(seq.token_ids) for seq in seqs)
    return {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated}


class TextShape:
    """/completions: one choice per prompt (n per prompt), `text` in the reply and in each chunk."""

    prefix, object, chunk_object = "cmpl", "text_completion", "text_completion"

    @staticmethod
    def logprobs(records: list[TokenLogprob] | None, offset: int = 0) -> dict | None:
        """{tokens, token_logprobs, top_logprobs, text_offset}; `offset`: characters before."""
        if records is None:
            return None
        offsets = list(itertools.accumulate((len(r.token) for r in records[:-1]), initial=offset))
        return {
            "tokens": [r.token for r in records],
            "token_logprobs": [r.logprob for r in records],
            "top_logprobs": [{text: lp for _, text, lp in r.top} for r in records],
            "text_offset": offsets if records else [],
        }

    @classmethod
    def choice(cls, index: int, seq: Sequence, records: list[TokenLogprob] | None) -> dict:
        return {"index": index, "text": seq.text, "logprobs": cls.logprobs(records), "finish_reason": seq.finish_reason}

    @staticmethod
    def opening(count: int) -> list[dict]:
        return []

    @classmethod
    def delta(cls, index: int, text: str, records=None, offset: int = 0, finish_reason: str | None = None) -> dict:
        return {"index": index, "text": text, "logprobs": cls.logprobs(records, offset), "finish_reason": finish_reason}


class ChatShape:
    """/chat/completions: an assistant `message`; chunks carry a `delta`, the first one the role."""

    prefix, object, chunk_object = "chatcmpl", "chat.completion", "chat.completion.chunk"

    @staticmethod
    def logprobs(records: list[TokenLogprob] | None, offset: int = 0) -> dict | None:
        """{content: [{token, logprob, bytes, top_logprobs}], refusal}"""
        if records is None:
            return None

        def entry(text: str, logprob: float) -> dict:
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

        content = [{**entry(r.token, r.logprob), "top_logprobs": [entry(t, lp) for _, t, lp in r.top]} for r in records]
        return {"content": content, "refusal": None}

    @classmethod
    def choice(cls, index: int, seq: Sequence, records: list[TokenLogprob] | None) -> dict:
        message = {"role": "assistant", "content": seq.text}
        logprobs = cls.logprobs(records)
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": seq.finish_reason}

    @staticmethod
    def opening(count: int) -> list[dict]:
        return [
            {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            for i in range(count)
        ]

    @classmethod
    def delta(cls, index: int, text: str, records=None, offset: int = 0, finish_reason: str | None = None) -> dict:
        delta = {"content": text} if text else {}
        return {"index": index, "delta": delta, "logprobs": cls.logprobs(records), "finish_reason": finish_reason}


def _respond(shape, engine: str, model: str, prompts: list[str], body: dict):
    """Run the prompts (n times each) and answer as one JSON object, or as server-sent chunks
    with `stream`. Choices are grouped per prompt: prompt p's i-th completion has index p*n + i."""
    stream, include_usage = _stream_options(body)
    config = _config()
    params = parse_sampling(body, config, default_temperature=1.0)  # OpenAI's default
    n = parse_n(body, config)
    want = params.logprobs is not None
    eng = completion.engine(engine)
    head = {"id": f"{shape.prefix}-{uuid.uuid4().hex}", "created": int(time.time()), "model": model}
    if stream:
        pieces = completion.Pieces(eng, prompts, params, n)
        return completion.sse(_chunks(pieces, shape, {**head, "object": shape.chunk_object}, include_usage, want))
    seqs = completion.complete(eng, prompts, params, n)
    choices = [shape.choice(i, seq, seq.logprobs if want else None) for i, seq in enumerate(seqs)]
    return jsonify({**head, "object": shape.object, "choices": choices, "usage": _usage(seqs)})


def _chunks(pieces: completion.Pieces, shape, head: dict, include_usage: bool, want: bool) -> Iterator[str]:
    """One chunk per piece of text, a last one per choice with its finish_reason, the usage chunk
    if asked, then [DONE]; an error after the first byte is an error event, then [DONE].
    With logprobs, each chunk carries those of the tokens generated since the choice's last one."""
    index = {seq.id: i for i, seq in enumerate(pieces.seqs)}
    sent_records = dict.fromkeys(index, 0)
    sent_chars = dict.fromkeys(index, 0)

    def chunk(seq: Sequence, text: str, finish_reason: str | None = None) -> str:
        records = None
        if want:  # the engine records a token's logprobs before it hands out its text
            end = len(seq.logprobs)
            records, sent_records[seq.id] = seq.logprobs[sent_records[seq.id] : end], end
        choice = shape.delta(index[seq.id], text, records, sent_chars[seq.id], finish_reason)
        sent_chars[seq.id] += len(text)
        return completion.event({**head, "choices": [choice]})

    try:
        for choice in shape.opening(len(pieces.seqs)):
            yield completion.event({**head, "choices": [choice]})
        for seq, text in pieces:
            if text is not None:
                yield chunk(seq, text)
            elif seq.error is not None:
                raise seq.error
            else:
                yield chunk(seq, "", seq.finish_reason)
        if include_usage:
            yield completion.event({**head, "choices": [], "usage": _usage(pieces.seqs)})
        yield DONE
    except (ApiError, EngineError) as exc:
        yield completion.event(errors.openai_error(exc)[0])
        yield DONE
    finally:
        pieces.close()  # also when the client went away: its sequences stop at their next step


@bp.post("/completions")
def completions(engine: str):
    body = schema.json_body(request)
    model = _check_model(body)
    prompt = body.get("prompt")
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if not isinstance(prompts, list) or not prompts:
        raise InvalidRequest("'prompt' must be a string or a non-empty list of strings", param="prompt")
    schema.check_prompts(prompts, _config(), "prompt")
    return _respond(TextShape, engine, model, prompts, body)


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


def render_chat(messages) -> str:
    """The model's own chat template, the same rendering for both engines."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list", param="messages")
    messages = [_message_text(i, m) for i, m in enumerate(messages)]
    tokenizer = current_app.extensions["tokenizer"]()
    if not tokenizer.chat_template:
        raise InvalidRequest("this model has no chat template: use /completions with a prompt", param="messages")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@bp.post("/chat/completions")
def chat_completions(engine: str):
    body = schema.json_body(request)
    model = _check_model(body)
    prompt = render_chat(body.get("messages"))
    if body.get("max_completion_tokens") is not None:  # the newer name wins
        body = {**body, "max_tokens": body["max_completion_tokens"]}
    body = chat_logprobs(body)  # logprobs: true + top_logprobs: k, as the one field the engines read
    return _respond(ChatShape, engine, model, [prompt], body)
