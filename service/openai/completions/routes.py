"""`POST /completions` under each base URL (service/openai/router.py adds it)."""

from __future__ import annotations

import functools

from flask import request

from service.http import lookup
from service.http.body import json_body
from service.openai import fields
from service.openai.completions import serving
from service.openai.completions.protocol import Completion


def completions(engine: str):
    req = fields.parse(json_body(request), Completion, "completions", lookup.config())
    served = lookup.served()
    served.check_model(req.model)
    return serving.create_completion(req, served, functools.partial(lookup.run, engine))


ROUTES = [("POST", "/completions", completions)]
