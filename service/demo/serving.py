"""The demo API's serving side, one function per route, each read top to bottom: the prompts fitted
to the context length and the request's one frozen `Plan` (`plan`, for every route and the race
feed), then the run (`generation.complete`) or the stream (`generation.Pieces`, the race's feed),
then the reply's shape (replies.py). The views (routes.py, page.py) hand each function its
validated body, what it is planned against and the way to its engine's `Run`.
"""

from __future__ import annotations

from flask import Response

from batcher.sampling import SamplingParams
from service import context_length, generation
from service.demo import replies
from service.demo.protocol import Generate, Race, Single
from service.demo.race import MODES, RaceFeed
from service.generation import RunFor
from service.http import sse
from service.plan import Plan, Served


def plan(req: Generate | Single, served: Served) -> Plan:
    """A demo request's plan: its prompt(s) checked against the context length, greedy unless asked."""
    params = req.to_sampling_params(served.config)
    key = "prompt" if isinstance(req, Single) else "prompts"
    prompts = context_length.fit(
        [req.prompt] if key == "prompt" else req.prompts, truncate=req.truncate_prompt_tokens,
        max_tokens=params.max_tokens, param=key, tokenizer=served.tokenizer, config=served.config,
    )  # fmt: skip
    return Plan(prompts=prompts, params=params, n=req.n or 1, details=bool(req.details), max_queue_ms=req.max_queue_ms)


def generate(req: Generate, served: Served, run_for: RunFor) -> Response:
    """`POST /generate`, `/generate_vllm`: every prompt n times, answered once all have finished."""
    p = plan(req, served)
    seqs = generation.complete(run_for(p.max_queue_ms), p.prompts, p.params, p.n)
    return replies.reply(seqs, p)


def basic_generate(req: Single, served: Served, run_for: RunFor) -> Response:
    """One prompt, run as a round of its own on the same model thread: the unbatched baseline.
    It waits its turn like any prompt, but never shares its round, whatever else is waiting."""
    p = plan(req, served)
    seqs = generation.complete(run_for(p.max_queue_ms), p.prompts, p.params, solo=True)
    return replies.reply(seqs, p, single=True)


def generate_stream(req: Single, served: Served, run_for: RunFor) -> Response:
    """`POST /generate_stream`, `/generate_vllm_stream`: one prompt's pieces as server-sent events."""
    p = plan(req, served)
    pieces = generation.Pieces(run_for(p.max_queue_ms), p.prompts, p.params, until_entered=p.details)
    return sse.response(replies.events(pieces, details=p.details, logprobs=p.logprobs))


def race(req: Race, served: Served, run_for: RunFor) -> Response:
    """`POST /race`: the page's feed (race.py), checked and planned as the generate routes are."""
    p = plan(req, served)
    run = run_for(p.max_queue_ms)  # the generate routes' deadlines, admission's too
    run.engine.check_available()  # 503 now, before the feed: loading, failed, disabled, draining
    # the page's two knobs; every other field at its neutral default, greedy
    params = SamplingParams(max_tokens=p.params.max_tokens, ignore_eos=p.params.ignore_eos)
    return sse.response(iter(RaceFeed(run, req.mode or MODES[0], p.prompts, params)))
