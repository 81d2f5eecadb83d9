"""The Responses API's reply: a `response` object (per the openai SDK's `openai.types.responses`)
with one output item, a `message` with one `output_text` part or a `function_call`."""

from __future__ import annotations

import time
import uuid

from batcher.sequence import Sequence
from service.openai.responses.protocol import Responses
from service.tools import parser
from service.tools.spec import Tools


def new_response(model: str, req: Responses, stored: bool) -> dict:
    """The Response object as it starts (a background one: queued): the fields the request
    decides, as it asked them; `stored`: whether it will be kept."""
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
        "store": stored,
        "previous_response_id": req.previous_response_id,
        "truncation": req.truncation or "disabled",
        "background": bool(req.background),
        "error": None,
        "incomplete_details": None,
        "usage": None,
        "status": "queued" if req.background else "in_progress",
        "output": [],
    }


def message_item(item_id: str, text: str, status: str) -> dict:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": [part]}


def call_item(item_id: str, call: dict, status: str) -> dict:
    fn = call["function"]
    item = {"type": "function_call", "id": item_id, "call_id": call["id"], "name": fn["name"]}
    return {**item, "arguments": fn["arguments"], "status": status}


def finished(response: dict, seq: Sequence, item: dict) -> dict:
    """`response` once `seq` is done, with its one output item."""
    cut = seq.finish_reason == "length"
    counts = {"input_tokens": seq.prompt_tokens or 0, "output_tokens": len(seq.token_ids)}
    counts["total_tokens"] = counts["input_tokens"] + counts["output_tokens"]
    details = {
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    return {
        **response,
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "output": [item],
        "usage": {**counts, **details},
    }


def whole(response: dict, seq: Sequence, tools: Tools | None) -> dict:
    """`response` once `seq` is done: its text, or the call it makes (`tools`: the request's)."""
    content, call = parser.parse(seq.text, tools)
    status = "incomplete" if seq.finish_reason == "length" else "completed"
    if call is not None:
        return finished(response, seq, call_item(f"fc_{uuid.uuid4().hex}", call, "completed"))
    return finished(response, seq, message_item(f"msg_{uuid.uuid4().hex}", content or "", status))
