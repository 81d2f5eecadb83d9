"""`POST /chat/completions` under each base URL (service/openai/router.py adds it)."""

from __future__ import annotations

import functools

from flask import request

from service.http import lookup
from service.http.body import json_body
from service.openai import fields
from service.openai.chat import serving
from service.openai.chat.protocol import Chat


def chat_completions(engine: str):
    req = fields.parse(json_body(request), Chat, "chat", lookup.config())
    served = lookup.served()
    served.check_model(req.model)
    return serving.create_chat_completion(req, served, functools.partial(lookup.run, engine))


ROUTES = [("POST", "/chat/completions", chat_completions)]
