"""The live race page at / (templates/race.html, static/race.*) and the feed it draws from."""

from __future__ import annotations

from flask import Blueprint, current_app, render_template

from batcher.sampling import SamplingParams
from service.demo.race import MODES, Race
from service.http import auth, sse
from service.http import body as schema
from service.protocol import demo as bodies

bp = Blueprint("page", __name__)

# The write-up's experiment: six prompts a..f, which BATCH_SIZE 4 runs as rounds of 4 and 2.
DEFAULT_PROMPTS = ["a", "b", "c", "d", "e", "f"]


@bp.get("/")
def index():
    config = current_app.config["SERVICE"]
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
    req = schema.from_request(bodies.Race)  # the generate routes' own checks, and the engine and mode
    eng = current_app.extensions["engines"][req.body.engine]
    eng.check_available()  # 503 now, before the feed: loading, failed, disabled, draining
    # the page's two knobs; every other field at its neutral default, greedy
    params = SamplingParams(max_tokens=req.params.max_tokens, ignore_eos=req.params.ignore_eos)
    feed = Race(eng, req.body.mode or MODES[0], req.prompts, params, current_app.config["SERVICE"].request_timeout_s)
    return sse.response(iter(feed))
