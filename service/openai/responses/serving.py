"""`POST /v1/responses`, served: OpenAI's Responses API, a subset, over chat's rendering and the
same generation core. The request is read as the chat request it means (its model,
responses/protocol.py): the earlier turns' items (`previous_response_id`, read from the store
by the route), then `input` and `instructions`, become the messages, and its one prompt is fitted
to the context as chat's is (the oldest turns dropped first where `truncation` is auto); the
reply is one `response` object (shape.py), or its events (events.py), kept by `keep` once done."""

from __future__ import annotations

from collections.abc import Iterator

from flask import Response, jsonify

from batcher.sampling import SamplingParams
from batcher.sequence import Prompt
from service import generation
from service.context_length import ContextTooLong
from service.generation import Run, RunFor
from service.http import sse
from service.openai.chat.template import fit_prompt
from service.openai.responses import events, shape
from service.openai.responses.events import Keep
from service.openai.responses.protocol import Responses
from service.openai.responses.stored import PARAM
from service.plan import Plan, Served


def create_response(
    req: Responses, served: Served, run_for: RunFor, history: list[dict], keep: Keep | None
) -> Response:
    response = shape.new_response(served.config.model_name, req, stored=keep is not None)
    plan = prepare(req, served, history)
    run = run_for(None)  # no `max_queue_ms` in a Responses body: X-Max-Queue-Ms alone
    if plan.stream:
        return sse.response(stream(run, plan, response, keep))
    [seq] = generation.complete(run, plan.prompts, plan.params)
    final = shape.whole(response, seq, plan.tools)
    if keep is not None:
        keep(final)
    return jsonify(final)


def queue(req: Responses, served: Served, history: list[dict]) -> dict:
    """A background turn as it is answered at once: queued, its prompt checked (its 400s now)."""
    prepare(req, served, history)
    return shape.new_response(served.config.model_name, req, stored=True)


def prepare(req: Responses, served: Served, history: list[dict]) -> Plan:
    """What the turn runs: its one prompt after `history`, its sampling, its tools."""
    params = req.to_sampling_params(served.config)
    prompts = _fit(req, served, history, params)
    return Plan(prompts=prompts, params=params, stream=bool(req.stream), tools=req.function_tools)


def stream(run: Run, plan: Plan, response: dict, keep: Keep | None) -> Iterator[str]:
    """The turn's events; an error before its first piece raises here (a plain HTTP error)."""
    return events.events(generation.Pieces(run, plan.prompts, plan.params), response, plan.tools, keep)


def _fit(req: Responses, served: Served, history: list[dict], params: SamplingParams) -> tuple[Prompt, ...]:
    """The turn's one prompt after `history`; too long, a 400 naming `previous_response_id` where
    the history made it so, unless `truncation` is auto: then its oldest turns go, a user
    message first in what is kept, until it fits."""
    while True:
        param = PARAM if history else "input"
        try:
            return fit_prompt(served, req.messages_after(history), req.function_tools, params, None, param)
        except ContextTooLong:
            if not history or req.truncation != "auto":
                raise
        history = history[1:]
        while history and not (history[0].get("type", "message") == "message" and history[0].get("role") == "user"):
            history = history[1:]
