"""vLLM's `/tokenize` and `/detokenize`, one blueprint registered once per engine: `/tokenize`
for vLLM, `/static/tokenize` for the static batcher (vLLM serves them at its root, beside `/v1`).

Shapes as vLLM 0.32's (vllm/entrypoints/serve/tokenize/protocol.py): `{"prompt"}` or
`{"messages", "add_generation_prompt"}` in, `{"count", "max_model_len", "tokens"}` out (and
`token_strs` with `return_token_strs`); `{"tokens"}` in, `{"prompt"}` out. The text is the
tokenizer's that both engines run, the chat rendering the chat route's (`service/openai/chat.py`), and
`max_model_len` what `/v1/models` reports. Errors in OpenAI's shape, as on `/v1`.
"""

from __future__ import annotations

from flask import Blueprint, Flask, jsonify, request

from service import errors
from service.http import auth, lookup
from service.http.body import json_body
from service.openai import chat, fields
from service.protocol import validate
from service.protocol.tokenize import Detokenize, TokenizeChat, TokenizeText

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
    lookup.engine(request.view_args["engine"]).check_available()


@bp.post("/tokenize")
def tokenize(engine: str):
    body = json_body(request)
    is_chat = "messages" in body  # vLLM's union: a body with `messages` is a chat request
    fields.check(body, "tokenize_chat" if is_chat else "tokenize")
    served = lookup.served()
    req = validate(TokenizeChat if is_chat else TokenizeText, body, served.config)
    served.check_model(req.model)
    if is_chat:
        generation_prompt = _or(req.add_generation_prompt, True)
        text = chat.render(served, req.template_messages, add_generation_prompt=generation_prompt)
        add_special_tokens = _or(req.add_special_tokens, False)  # the template has them
    else:
        text, add_special_tokens = req.prompt, _or(req.add_special_tokens, True)
    ids = served.tokenizer(text, add_special_tokens=add_special_tokens).input_ids
    reply = {"count": len(ids), "max_model_len": served.config.max_model_len, "tokens": ids, "token_strs": None}
    if req.return_token_strs:
        reply["token_strs"] = served.tokenizer.convert_ids_to_tokens(ids)
    return jsonify(reply)


@bp.post("/detokenize")
def detokenize(engine: str):
    body = json_body(request)
    fields.check(body, "detokenize")
    served = lookup.served()
    req = validate(Detokenize, body, served.config)
    served.check_model(req.model)
    lookup.engine(engine).check_token_ids(req.tokens, "tokens")  # what a token-id prompt may name
    return jsonify({"prompt": served.tokenizer.decode(req.tokens)})


def _or(value: bool | None, default: bool) -> bool:
    return default if value is None else value
