"""OpenAI's Responses API (`POST /v1/responses`, `/static/v1/responses`): a subset, stateless,
over the chat route's rendering and the same generation core; shapes per the openai SDK's
`openai.types.responses`.

A request is read as the chat body it means (`as_chat`): `input` (a string, or message,
`function_call` and `function_call_output` items) and `instructions` (a system turn first)
become `messages`; `max_output_tokens`, `temperature`, `top_p`, `tools` (function tools),
`tool_choice`, `parallel_tool_calls` and `text.format` (text, json_object, json_schema) become
their chat fields. Nothing is stored: `store: true` and `previous_response_id` are 400s naming
them, and so is every field not in FIELDS; fields that change no output are IGNORED.
"""

from __future__ import annotations

import time
import uuid

from batcher.sequence import Sequence
from service.errors import InvalidRequest
from service.protocol import names
from service.protocol.openai import Responses
from service.tools import parser as tool_replies
from service.tools.spec import Tools

FIELDS = names(Responses)  # service/protocol/openai.py checks their types
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


def _parts_text(i: int, content) -> str:
    if isinstance(content, str):
        return content
    kinds = ("input_text", "output_text")
    if not isinstance(content, list) or not all(isinstance(p, dict) and p.get("type") in kinds for p in content):
        raise InvalidRequest(f"'input[{i}].content' must be a string or input_text parts", param="input")
    return "".join(str(part.get("text", "")) for part in content)


def _messages(value) -> list[dict]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InvalidRequest("'input' must be a string or a non-empty list of items", param="input")
    messages: list[dict] = []
    for i, item in enumerate(value):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message" and isinstance(item.get("role"), str):
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": _parts_text(i, item.get("content"))})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function"}
            call["function"] = {"name": item.get("name"), "arguments": item.get("arguments")}
            if messages and messages[-1].get("tool_calls"):  # calls in a row: one assistant turn
                messages[-1]["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": item.get("output")})
        else:
            rule = "a message ({role, content}), a function_call or a function_call_output"
            raise InvalidRequest(f"'input[{i}]' must be {rule}", param="input")
    return messages


def _tools(value):
    if not isinstance(value, list):
        return value  # service/tools/spec.py says what is wrong
    out = []
    for tool in value:
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise InvalidRequest("'tools': only function tools are supported", param="tools")
        fn = {key: tool[key] for key in ("name", "description", "parameters", "strict") if key in tool}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(value):
    if isinstance(value, dict) and value.get("type") == "function":
        return {"type": "function", "function": {"name": value.get("name")}}
    return value


def _format(text) -> dict | None:
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(text, dict) or set(text) - {"format"} or (fmt is not None and not isinstance(fmt, dict)):
        rule = "{'format': {'type': 'text' | 'json_object' | 'json_schema'}}"
        raise InvalidRequest(f"'text' must be {rule}", param="text")
    if fmt is None or fmt.get("type") != "json_schema":
        return fmt
    described = {key: fmt[key] for key in ("name", "schema", "strict") if key in fmt}
    return {"type": "json_schema", "json_schema": described}


def as_chat(body: dict) -> dict:
    """The chat body the request means."""
    messages = _messages(body.get("input"))
    if body.get("instructions") is not None:
        messages.insert(0, {"role": "system", "content": body["instructions"]})
    chat = {key: body.get(key) for key in ("temperature", "top_p", "parallel_tool_calls")}
    chat["max_tokens"] = body.get("max_output_tokens")
    chat["tools"], chat["tool_choice"] = _tools(body.get("tools")), _tool_choice(body.get("tool_choice"))
    return {**chat, "messages": messages, "response_format": _format(body.get("text"))}


def head(model: str, body: dict) -> dict:
    """The fields of the Response object that the request decides, as it asked them."""
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
    content, call = tool_replies.parse(seq.text, tools)
    status = "incomplete" if seq.finish_reason == "length" else "completed"
    if call is not None:
        return finished(head, seq, call_item(f"fc_{uuid.uuid4().hex}", call, "completed"))
    return finished(head, seq, message_item(f"msg_{uuid.uuid4().hex}", content or "", status))
