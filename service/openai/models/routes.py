"""`GET /models` under each base URL (service/openai/router.py adds it)."""

from __future__ import annotations

from flask import jsonify

from service.http import lookup
from service.openai.models.serving import model_card


def models(engine: str):
    return jsonify({"object": "list", "data": [model_card(lookup.state())]})


ROUTES = [("GET", "/models", models)]
