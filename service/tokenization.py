"""vLLM's `/tokenize` and `/detokenize`, one blueprint registered once per engine: `/tokenize`
for vLLM, `/static/tokenize` for the static batcher (vLLM serves them at its root, beside `/v1`).

Shapes as vLLM 0.32's (vllm/entrypoints/serve/tokenize/protocol.py): `{"prompt"}` or
`{"messages", "add_generation_prompt"}` in, `{"count", "max_model_len", "tokens"}` out (and
`token_strs` with `return_token_strs`); `{"tokens"}` in, `{"prompt"}` out. The text is the
tokenizer's that both engines run, the chat rendering the chat route's (`service/chat.py`), and
`max_model_len` what `/v1/models` reports. Errors in OpenAI's shape, as on `/v1`.
"""

from __future__ import annotations

from flask import Blueprint, Flask, current_app, jsonify, request

from service import auth, chat, errors, generation, openai_api, openai_fields, schema
from service.errors import InvalidRequest

bp = auth.protect(Blueprint("tokenize", __name__))
errors.register_openai(bp)

PREFIXES = {"vllm": "", "static": "/static"}


def register(app: Flask) -> None:
    for engine, prefix in PREFIXES.items():
        app.register_blueprint(bp, name=f"tokenize_{engine}", url_prefix=prefix, url_defaults={"engine": engine})


@bp.before_request
def _engine_available() -> None:
    """A loading, failed, disabled or stopping engine answers 503 with the reason, as on `/v1`:
    the ids are the ones that engine would run."""
    generation.engine(request.view_args["engine"]).check_available()


def _tokenizer():
    return current_app.extensions["tokenizer"]()


@bp.post("/tokenize")
def tokenize(engine: str):
    body = schema.json_body(request)
    is_chat = "messages" in body  # vLLM's union: a body with `messages` is a chat request
    openai_fields.check(body, "tokenize_chat" if is_chat else "tokenize")
    openai_api.check_model(body)
    if is_chat:
        generation_prompt = _flag(body, "add_generation_prompt", default=True)
        messages = chat.messages(body["messages"])
        text = chat.render(messages, add_generation_prompt=generation_prompt)
        add_special_tokens = _flag(body, "add_special_tokens", default=False)  # the template has them
    else:
        text = body.get("prompt")
        if not isinstance(text, str) or not text:
            raise InvalidRequest("'prompt' must be a non-empty string (or send 'messages')", param="prompt")
        add_special_tokens = _flag(body, "add_special_tokens", default=True)
    tokenizer = _tokenizer()
    ids = tokenizer(text, add_special_tokens=add_special_tokens).input_ids
    config = current_app.config["SERVICE"]
    reply = {"count": len(ids), "max_model_len": config.max_model_len, "tokens": ids, "token_strs": None}
    if _flag(body, "return_token_strs", default=False):
        reply["token_strs"] = tokenizer.convert_ids_to_tokens(ids)
    return jsonify(reply)


@bp.post("/detokenize")
def detokenize(engine: str):
    body = schema.json_body(request)
    openai_fields.check(body, "detokenize")
    openai_api.check_model(body)
    ids = body.get("tokens")
    if not schema.is_token_ids(ids) or not ids:
        raise InvalidRequest("'tokens' must be a non-empty list of token ids (integers >= 0)", param="tokens")
    generation.engine(engine).check_token_ids(ids, "tokens")  # what a token-id prompt may name
    return jsonify({"prompt": _tokenizer().decode(ids)})


def _flag(body: dict, key: str, *, default: bool) -> bool:
    value = body.get(key)
    return default if value is None else schema.flag(body, key)
