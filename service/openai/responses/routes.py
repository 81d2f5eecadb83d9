"""`POST /responses` under each base URL (service/openai/router.py adds it)."""

from __future__ import annotations

import functools

from flask import request

from service.http import lookup
from service.http.body import json_body
from service.openai import fields
from service.openai.responses import serving
from service.openai.responses.protocol import Responses


def create_response(engine: str):
    req = fields.parse(json_body(request), Responses, "responses", lookup.config())
    served = lookup.served()
    served.check_model(req.model)
    return serving.create_response(req, served, functools.partial(lookup.run, engine))


ROUTES = [("POST", "/responses", create_response)]
