"""OpenAI's Responses API (`POST /v1/responses`, `/static/v1/responses`): a subset, stateless,
over the chat route's rendering and the same generation core; shapes per the openai SDK's
`openai.types.responses`.

A request is read as the chat request it means (its model, service/protocol/responses.py):
`input` (a string, or message, `function_call` and `function_call_output` items) and
`instructions` (a system turn first) become the messages; `max_output_tokens`, `temperature`,
`top_p`, `tools` (function tools), `tool_choice`, `parallel_tool_calls` and `text.format` (text,
json_object, json_schema) mean what their chat fields mean. Nothing is stored: `store: true`
and `previous_response_id` are 400s naming them, and so is every field not in FIELDS; fields
that change no output are IGNORED.
"""

from __future__ import annotations

import time
import uuid

from batcher.sequence import Sequence
from service.errors import InvalidRequest
from service.openai import chat
from service.plan import Plan, Served
from service.protocol import names
from service.protocol.responses import Responses
from service.tools import parser
from service.tools.spec import Tools

FIELDS = names(Responses)  # service/protocol/responses.py checks their types
IGNORED = "metadata user safety_identifier prompt_cache_key service_tier stream_options".split()
# refused unless their value is the one that means what we do anyway
ONLY = {"store": False, "truncation": "disabled", "background": False, "include": []}
STATELESS = "this service stores no responses: send the whole conversation as 'input'"


def check(body: dict) -> dict:
    """The body, every field known and honoured (or one that changes nothing); else a 400 naming it."""
    for key, value in body.items():
        if key in FIELDS or key in IGNORED or value is None:
            continue
        if key in ONLY and value == ONLY[key] and isinstance(value, type(ONLY[key])):
            continue
        if key in ("store", "previous_response_id", "conversation"):
            raise InvalidRequest(f"'{key}' is not supported: {STATELESS}", param=key)
        allowed = f" (only {ONLY[key]!r})" if key in ONLY else ""
        raise InvalidRequest(f"'{key}' is not supported on /responses{allowed}", param=key)
    return body


def plan(req: Responses, served: Served) -> Plan:
    """The request's one prompt (its messages rendered as chat renders them, the same context-length
    rule) and its parameters."""
    params = req.to_sampling_params(served.config)
    prompts = chat.prompt(served, req.template_messages, req.function_tools, params, None, "input")
    return Plan(prompts=prompts, params=params, stream=bool(req.stream), tools=req.function_tools)


def head(model: str, req: Responses) -> dict:
    """The fields of the Response object that the request decides, as it asked them."""
    asked = req.model_dump(by_alias=True, exclude_unset=True)
    body = {**asked, **(req.model_extra or {})}
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "temperature": body.get("temperature", 1.0),
        "top_p": body.get("top_p", 1.0),
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
        "text": {"format": (body.get("text") or {}).get("format") or {"type": "text"}},
        "metadata": body.get("metadata") or {},
        "store": False,
        "truncation": "disabled",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "usage": None,
        "status": "in_progress",
        "output": [],
    }


def message_item(item_id: str, text: str, status: str) -> dict:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": [part]}


def call_item(item_id: str, call: dict, status: str) -> dict:
    fn = call["function"]
    item = {"type": "function_call", "id": item_id, "call_id": call["id"], "name": fn["name"]}
    return {**item, "arguments": fn["arguments"], "status": status}


def finished(head: dict, seq: Sequence, item: dict) -> dict:
    """The Response once `seq` is done, with its one output item."""
    cut = seq.finish_reason == "length"
    counts = {"input_tokens": seq.prompt_tokens or 0, "output_tokens": len(seq.token_ids)}
    counts["total_tokens"] = counts["input_tokens"] + counts["output_tokens"]
    details = {
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    return {
        **head,
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "output": [item],
        "usage": {**counts, **details},
    }


def whole(head: dict, seq: Sequence, tools: Tools | None) -> dict:
    content, call = parser.parse(seq.text, tools)
    status = "incomplete" if seq.finish_reason == "length" else "completed"
    if call is not None:
        return finished(head, seq, call_item(f"fc_{uuid.uuid4().hex}", call, "completed"))
    return finished(head, seq, message_item(f"msg_{uuid.uuid4().hex}", content or "", status))
