"""The demo API, one route family registered once per engine: {"prompts": [...]} in,
{"generated_texts": [...]} out. The static batcher serves /generate, /basic_generate and
/generate_stream; vLLM's continuous batching /generate_vllm and /generate_vllm_stream, the same
contract. Each registration is a blueprint named for its engine (the name that metrics, the
request log and auth go by, service/__init__.py's GENERATE_BLUEPRINTS). Each view reads its body
once (protocol.py), looks up what it is planned against and its engine, and hands them to
serving.py.
"""

from __future__ import annotations

import functools

from flask import Blueprint, Flask, request
from flask.blueprints import BlueprintSetupState

from service.demo import serving
from service.demo.protocol import Generate, Single
from service.http import auth, lookup
from service.http.body import json_body
from service.plan import Served
from service.protocol import validate

ROUTES = {  # engine -> {view: its URL}
    "static": {"generate": "/generate", "basic_generate": "/basic_generate", "generate_stream": "/generate_stream"},
    "vllm": {"generate": "/generate_vllm", "generate_stream": "/generate_vllm_stream"},
}

bp = auth.protect(Blueprint("demo", __name__))


def register(app: Flask) -> None:
    for engine in ROUTES:
        app.register_blueprint(bp, name=engine, url_defaults={"engine": engine})


def _read(model: type[Generate | Single]) -> tuple[Generate | Single, Served]:
    """The request's body as `model` (unknown fields, types and ranges checked there), and what it
    is planned against."""
    served = lookup.served()
    return validate(model, json_body(request), served.config), served


def generate(engine: str):
    req, served = _read(Generate)
    return serving.generate(req, served, functools.partial(lookup.run, engine))


def basic_generate(engine: str):
    req, served = _read(Single)
    return serving.basic_generate(req, served, functools.partial(lookup.run, engine))


def generate_stream(engine: str):
    req, served = _read(Single)
    return serving.generate_stream(req, served, functools.partial(lookup.run, engine))


VIEWS = {"generate": generate, "basic_generate": basic_generate, "generate_stream": generate_stream}


@bp.record
def _routes(state: BlueprintSetupState) -> None:
    """Each registration adds its engine's URLs (a blueprint's own rules would be the same for
    every engine; these differ by name, not by a prefix)."""
    for view, rule in ROUTES[state.url_defaults["engine"]].items():
        state.add_url_rule(rule, view, VIEWS[view], methods=["POST"])
