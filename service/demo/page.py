"""The live race page at / (templates/race.html, static/race.*) and the feed it draws from."""

from __future__ import annotations

import functools

from flask import Blueprint, render_template, request

from service.demo import serving
from service.demo.protocol import Race
from service.http import auth, lookup
from service.http.body import json_body
from service.protocol import validate

bp = Blueprint("page", __name__)

# The write-up's experiment: six prompts a..f, which BATCH_SIZE 4 runs as rounds of 4 and 2.
DEFAULT_PROMPTS = ["a", "b", "c", "d", "e", "f"]


@bp.get("/")
def index():
    config = lookup.config()
    return render_template(
        "race.html",
        prompts="\n".join(DEFAULT_PROMPTS),
        max_tokens=config.max_new_tokens,
        max_tokens_limit=config.max_new_tokens_limit,
        max_prompts=config.max_prompts_per_request,
        batch_size=config.batch_size,
    )


@bp.get("/favicon.ico")
def favicon():
    """No icon, and no 404 either: a browser asks for /favicon.ico on any document it opens
    (/health's JSON too), and a 404 there is an error in its console and a line in our log."""
    return "", 204


@bp.post("/race")
def race():
    """Body: {"engine": "static"|"vllm", "mode": "concurrent"|"batch", "prompts": [...],
    "max_tokens"?, "ignore_eos"?}. Server-sent events, one per event of each prompt's reply."""
    auth.require_api_key()  # once for the race: the page itself stays open, its feed does not
    served = lookup.served()
    body = validate(Race, json_body(request), served.config)  # the generate routes' checks, the engine, the mode
    return serving.race(body, served, functools.partial(lookup.run, body.engine))
