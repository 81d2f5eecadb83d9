"""`POST /v1/responses`, served: OpenAI's Responses API, a subset, stateless, over chat's rendering
and the same generation core. The request is read as the chat request it means (its model,
responses/protocol.py): `input` items and `instructions` become the messages, and its one
prompt is fitted to the context as chat's is; the reply is one `response` object (shape.py), or
its events (events.py)."""

from __future__ import annotations

from flask import Response, jsonify

from service import generation
from service.generation import RunFor
from service.http import sse
from service.openai.chat.template import fit_prompt
from service.openai.responses import events, shape
from service.openai.responses.protocol import Responses
from service.plan import Plan, Served


def create_response(req: Responses, served: Served, run_for: RunFor) -> Response:
    response = shape.new_response(served.config.model_name, req)
    params = req.to_sampling_params(served.config)
    prompts = fit_prompt(served, req.template_messages, req.function_tools, params, None, "input")
    plan = Plan(prompts=prompts, params=params, stream=bool(req.stream), tools=req.function_tools)
    run = run_for(None)  # no `max_queue_ms` in a Responses body: X-Max-Queue-Ms alone
    if plan.stream:
        pieces = generation.Pieces(run, plan.prompts, plan.params)
        return sse.response(events.events(pieces, response, plan.tools))
    [seq] = generation.complete(run, plan.prompts, plan.params)
    return jsonify(shape.whole(response, seq, plan.tools))
