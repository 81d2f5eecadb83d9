"""`POST /tokenize` and `/detokenize`, at the root for vLLM and under `/static` for the static
batcher, as vLLM serves them beside `/v1` (service/openai/router.py adds them). A loading,
failed, disabled or stopping engine answers 503, as on `/v1`: the ids are the ones that engine
would run. Errors in OpenAI's shape."""

from __future__ import annotations

from flask import jsonify, request

from service.http import lookup
from service.http.body import json_body
from service.openai import fields
from service.openai.tokenize import serving
from service.openai.tokenize.protocol import Detokenize, TokenizeChat, TokenizeText


def tokenize(engine: str):
    body = json_body(request)
    is_chat = "messages" in body  # vLLM's union: a body with `messages` is a chat request
    model, route = (TokenizeChat, "tokenize_chat") if is_chat else (TokenizeText, "tokenize")
    req = fields.parse(body, model, route, lookup.config())
    served = lookup.served()
    served.check_model(req.model)
    return jsonify(serving.tokenize(req, served))


def detokenize(engine: str):
    req = fields.parse(json_body(request), Detokenize, "detokenize", lookup.config())
    served = lookup.served()
    served.check_model(req.model)
    lookup.engine(engine).check_token_ids(req.tokens, "tokens")  # what a token-id prompt may name
    return jsonify(serving.detokenize(req.tokens, served))


ROUTES = [("POST", "/tokenize", tokenize), ("POST", "/detokenize", detokenize)]
