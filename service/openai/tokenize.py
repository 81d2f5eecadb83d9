"""vLLM's `/tokenize` and `/detokenize`, one blueprint registered once per engine: `/tokenize`
for vLLM, `/static/tokenize` for the static batcher (vLLM serves them at its root, beside `/v1`).

Shapes as vLLM 0.32's (vllm/entrypoints/serve/tokenize/protocol.py): `{"prompt"}` or
`{"messages", "add_generation_prompt"}` in, `{"count", "max_model_len", "tokens"}` out (and
`token_strs` with `return_token_strs`); `{"tokens"}` in, `{"prompt"}` out. The text is the
tokenizer's that both engines run, the chat rendering the chat route's (`service/openai/chat.py`), and
`max_model_len` what `/v1/models` reports. Errors in OpenAI's shape, as on `/v1`.
"""

from __future__ import annotations

from flask import Blueprint, Flask, current_app, jsonify, request

from service import errors, generation
from service import protocol as bodies
from service.http import auth
from service.http import body as schema
from service.openai import chat
from service.openai import fields as openai_fields
from service.openai import routes as openai_api
from service.protocol.openai import Detokenize, TokenizeChat, TokenizeText

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
    fields = bodies.validate(TokenizeChat if is_chat else TokenizeText, body, current_app.config["SERVICE"])
    openai_api.check_model(body)
    if is_chat:
        generation_prompt = _or(fields.add_generation_prompt, True)
        text = chat.render(chat.messages(body["messages"]), add_generation_prompt=generation_prompt)
        add_special_tokens = _or(fields.add_special_tokens, False)  # the template has them
    else:
        text, add_special_tokens = fields.prompt, _or(fields.add_special_tokens, True)
    tokenizer = _tokenizer()
    ids = tokenizer(text, add_special_tokens=add_special_tokens).input_ids
    config = current_app.config["SERVICE"]
    reply = {"count": len(ids), "max_model_len": config.max_model_len, "tokens": ids, "token_strs": None}
    if fields.return_token_strs:
        reply["token_strs"] = tokenizer.convert_ids_to_tokens(ids)
    return jsonify(reply)


@bp.post("/detokenize")
def detokenize(engine: str):
    body = schema.json_body(request)
    openai_fields.check(body, "detokenize")
    ids = bodies.validate(Detokenize, body, current_app.config["SERVICE"]).tokens
    openai_api.check_model(body)
    generation.engine(engine).check_token_ids(ids, "tokens")  # what a token-id prompt may name
    return jsonify({"prompt": _tokenizer().decode(ids)})


def _or(value: bool | None, default: bool) -> bool:
    return default if value is None else value
