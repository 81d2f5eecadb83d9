"""The demo API, one route family registered once per engine: {"prompts": [...]} in,
{"generated_texts": [...]} out. The static batcher serves /generate, /basic_generate and
/generate_stream; vLLM's continuous batching /generate_vllm and /generate_vllm_stream, the same
contract. Each registration is a blueprint named for its engine (the name that metrics, the
request log and auth go by, service/__init__.py's GENERATE_BLUEPRINTS).
"""

from __future__ import annotations

from flask import Blueprint, Flask, request
from flask.blueprints import BlueprintSetupState

from service import context_length, generation
from service.demo import replies
from service.http import auth, lookup, sse
from service.http.body import json_body
from service.plan import Plan, Served
from service.protocol import validate
from service.protocol.demo import Generate, Single

ROUTES = {  # engine -> {view: its URL}
    "static": {"generate": "/generate", "basic_generate": "/basic_generate", "generate_stream": "/generate_stream"},
    "vllm": {"generate": "/generate_vllm", "generate_stream": "/generate_vllm_stream"},
}

bp = auth.protect(Blueprint("demo", __name__))


def register(app: Flask) -> None:
    for engine in ROUTES:
        app.register_blueprint(bp, name=engine, url_defaults={"engine": engine})


def plan(req: Generate | Single, served: Served) -> Plan:
    """A demo request's plan: its prompt(s) checked against the context length, greedy unless asked."""
    params = req.to_sampling_params(served.config)
    key = "prompt" if isinstance(req, Single) else "prompts"
    prompts = context_length.fit(
        [req.prompt] if key == "prompt" else req.prompts, truncate=req.truncate_prompt_tokens,
        max_tokens=params.max_tokens, param=key, tokenizer=served.tokenizer, config=served.config,
    )  # fmt: skip
    return Plan(prompts=prompts, params=params, n=req.n or 1, details=bool(req.details), max_queue_ms=req.max_queue_ms)


def read(model: type[Generate | Single]) -> Plan:
    """The request's body as `model` (unknown fields, types and ranges checked there), planned."""
    served = lookup.served()
    return plan(validate(model, json_body(request), served.config), served)


def generate(engine: str):
    p = read(Generate)
    seqs = generation.complete(lookup.run(engine, p.max_queue_ms), p.prompts, p.params, p.n)
    return replies.reply(seqs, p)


def basic_generate(engine: str):
    """One prompt, run as a round of its own on the same model thread: the unbatched baseline.
    It waits its turn like any prompt, but never shares its round, whatever else is waiting."""
    p = read(Single)
    seqs = generation.complete(lookup.run(engine, p.max_queue_ms), p.prompts, p.params, solo=True)
    return replies.reply(seqs, p, single=True)


def generate_stream(engine: str):
    p = read(Single)
    pieces = generation.Pieces(lookup.run(engine, p.max_queue_ms), p.prompts, p.params, until_entered=p.details)
    return sse.response(replies.events(pieces, details=p.details, logprobs=p.logprobs))


VIEWS = {"generate": generate, "basic_generate": basic_generate, "generate_stream": generate_stream}


@bp.record
def _routes(state: BlueprintSetupState) -> None:
    """Each registration adds its engine's URLs (a blueprint's own rules would be the same for
    every engine; these differ by name, not by a prefix)."""
    for view, rule in ROUTES[state.url_defaults["engine"]].items():
        state.add_url_rule(rule, view, VIEWS[view], methods=["POST"])
