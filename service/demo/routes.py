"""The demo API, one route family registered once per engine: {"prompts": [...]} in,
{"generated_texts": [...]} out. The static batcher serves /generate, /basic_generate and
/generate_stream; vLLM's continuous batching /generate_vllm and /generate_vllm_stream, the same
contract. Each registration is a blueprint named for its engine (the name that metrics, the
request log and auth go by, service/__init__.py's GENERATE_BLUEPRINTS).
"""

from flask import Blueprint, Flask
from flask.blueprints import BlueprintSetupState

from service import generation
from service.demo import replies as demo_replies
from service.http import auth, sse
from service.http import body as schema
from service.protocol.demo import Single

ROUTES = {  # engine -> {view: its URL}
    "static": {"generate": "/generate", "basic_generate": "/basic_generate", "generate_stream": "/generate_stream"},
    "vllm": {"generate": "/generate_vllm", "generate_stream": "/generate_vllm_stream"},
}

bp = auth.protect(Blueprint("demo", __name__))


def register(app: Flask) -> None:
    for engine in ROUTES:
        app.register_blueprint(bp, name=engine, url_defaults={"engine": engine})


def generate(engine: str):
    req = schema.from_request()
    seqs = generation.complete(generation.engine(engine), req.prompts, req.params, req.n)
    return demo_replies.reply(seqs, req)


def basic_generate(engine: str):
    """One prompt, run as a round of its own on the same model thread: the unbatched baseline.
    It waits its turn like any prompt, but never shares its round, whatever else is waiting."""
    req = schema.from_request(Single)
    seqs = generation.complete(generation.engine(engine), req.prompts, req.params, solo=True)
    return demo_replies.reply(seqs, req, single=True)


def generate_stream(engine: str):
    req = schema.from_request(Single)
    pieces = generation.Pieces(generation.engine(engine), req.prompts[:1], req.params, until_entered=req.details)
    return sse.response(demo_replies.events(pieces, details=req.details, logprobs=req.params.logprobs is not None))


VIEWS = {"generate": generate, "basic_generate": basic_generate, "generate_stream": generate_stream}


@bp.record
def _routes(state: BlueprintSetupState) -> None:
    """Each registration adds its engine's URLs (a blueprint's own rules would be the same for
    every engine; these differ by name, not by a prefix)."""
    for view, rule in ROUTES[state.url_defaults["engine"]].items():
        state.add_url_rule(rule, view, VIEWS[view], methods=["POST"])
