"""The OpenAI API's URLs, each family registered once per engine: `/v1/...` is served by vLLM's
continuous batching, `/static/v1/...` by the static batcher, and vLLM's `/tokenize` and
`/detokenize` sit at the root and under `/static`. So the `openai` SDK, and any benchmark client
that speaks the OpenAI API, compares the two engines by its base URL alone.

Each API's routes.py lists its thin views (ROUTES); here they join their family's blueprint,
which asks for the API key, answers errors in OpenAI's shape, answers 503 for an engine that
cannot serve now (but on STORAGE_ROUTES: the Files and Batches routes and the stored responses',
which generate nothing), and (under `/v1`) 404 for any other path.
"""

from __future__ import annotations

from flask import Blueprint, Flask, request
from werkzeug.exceptions import NotFound

from service import errors
from service.http import auth, lookup
from service.openai.batches import routes as batches
from service.openai.chat import routes as chat
from service.openai.completions import routes as completions
from service.openai.files import routes as files
from service.openai.models import routes as models
from service.openai.responses import routes as responses
from service.openai.tokenize import routes as tokenize

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
# Files and Batches keep what is sent for later: they run no prompt, so they answer whatever the
# engine's state (a batch made while its engine loads runs once it is ready)
STORAGE = (files, batches)
STORAGE_ROUTES = (*files.ROUTES, *batches.ROUTES, *responses.STORED_ROUTES)  # and the stored responses
STORAGE_VIEWS = frozenset(view.__name__ for _, _, view in STORAGE_ROUTES)


def unknown_path(engine: str, unknown: str):
    """Any other path under the base URL: 404 in OpenAI's shape (the blueprint's error handler),
    as OpenAI answers it, whichever engine and whether or not it is ready."""
    raise NotFound(f"Invalid URL ({request.method} {request.path})")


def _engine_available() -> None:
    """Every route of a loading, failed, disabled or stopping engine answers 503 with the reason,
    but for ENGINE_FREE's."""
    if request.view_args is not None and request.endpoint.rsplit(".", 1)[-1] not in ENGINE_FREE:
        lookup.engine(request.view_args["engine"]).check_available()


def _family(name: str, apis) -> Blueprint:
    """One blueprint for the views of `apis` (each API's routes.py: its ROUTES)."""
    bp = auth.protect(Blueprint(name, __name__))
    errors.register_openai(bp)
    bp.before_request(_engine_available)
    for api in apis:
        for method, rule, view in api.ROUTES:
            bp.add_url_rule(rule, view_func=view, methods=[method])
    return bp


openai = _family("openai", (completions, chat, responses, models, *STORAGE))
openai.add_url_rule("/", view_func=unknown_path, defaults={"unknown": ""}, methods=METHODS, strict_slashes=False)
openai.add_url_rule("/<path:unknown>", view_func=unknown_path, methods=METHODS)
ENGINE_FREE = STORAGE_VIEWS | {unknown_path.__name__}  # the views that answer whatever the engine's state
# family -> (its blueprint, engine -> its URL prefix)
FAMILIES = {
    "openai": (openai, {"vllm": "/v1", "static": "/static/v1"}),
    "tokenize": (_family("tokenize", (tokenize,)), {"vllm": "", "static": "/static"}),
}


def register(app: Flask) -> None:
    for family, (bp, prefixes) in FAMILIES.items():
        for engine, prefix in prefixes.items():
            app.register_blueprint(bp, name=f"{family}_{engine}", url_prefix=prefix, url_defaults={"engine": engine})


def blueprints(family: str) -> set[str]:
    """The names a family's blueprint is registered under, one per engine."""
    return {f"{family}_{engine}" for engine in FAMILIES[family][1]}


def storage_endpoints() -> frozenset[str]:
    """The endpoints of STORAGE's views, under every base URL: no prompt runs behind them."""
    return frozenset(f"{bp}.{name}" for bp in blueprints("openai") for name in STORAGE_VIEWS)
