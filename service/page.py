"""The live race page at / (templates/race.html, static/race.*) and the feed it draws from."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, render_template, request, stream_with_context

from batcher.errors import NotReady
from service import generation, schema
from service.errors import InvalidRequest
from service.race import MODES, PATHS, Race

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


@bp.post("/race")
def race():
    """Body: {"engine": "static"|"vllm", "mode": "concurrent"|"batch", "prompts": [...],
    "max_tokens"?, "ignore_eos"?}. Server-sent events, one per event of each prompt's reply."""
    req = schema.from_request()  # prompts, max_tokens, ignore_eos: the generate routes' own checks
    body = request.get_json(force=True)  # parsed above already (cached); any Content-Type, as there
    engine, mode = body.get("engine"), body.get("mode", "concurrent")
    if not isinstance(engine, str) or engine not in PATHS:
        raise InvalidRequest(f"'engine' must be one of {sorted(PATHS)}, got {engine!r}")
    if not isinstance(mode, str) or mode not in MODES:
        raise InvalidRequest(f"'mode' must be one of {list(MODES)}, got {mode!r}")
    eng = generation.engine(engine)
    if eng.status != "ready":
        raise NotReady(f"the {engine} engine is not ready ({eng.status})")
    params = {"max_tokens": req.params.max_tokens, "ignore_eos": req.params.ignore_eos}
    # the caller's credentials go with each prompt, so the generate routes' own auth applies
    auth = {"Authorization": request.headers["Authorization"]} if "Authorization" in request.headers else {}
    feed = Race(current_app._get_current_object(), engine, mode, req.prompts, params, auth)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return Response(stream_with_context(iter(feed)), mimetype="text/event-stream", headers=headers)
