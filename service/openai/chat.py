"""Chat messages as the chat template reads them, and their rendering: one for both engines, the
chat route, the Responses route and /tokenize.

The template is the model's own, or the file CHAT_TEMPLATE names (as vLLM's `--chat-template`).
A template that reads `tools` renders the tools and the tool turns itself (transformers'
`apply_chat_template(..., tools=...)`); one that does not (SmolLM2's) gets them written in our
format (service/tools/prompt.py).
"""

from __future__ import annotations

import functools

import jinja2
import jinja2.meta
from flask import current_app

from service.errors import InvalidRequest
from service.tools import prompt as tool_prompt
from service.tools.spec import Tools


def _text(i: int, content, *, nullable: bool = False) -> str | None:
    if content is None and nullable:
        return None
    if isinstance(content, list):  # content parts: only text ones have meaning for this model
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise InvalidRequest(f"'messages[{i}].content' parts must be text parts", param="messages")
        content = "".join(part["text"] for part in content)
    if not isinstance(content, str):
        raise InvalidRequest(f"'messages[{i}].content' must be a string or a list of text parts", param="messages")
    return content


def _tool_call(i: int, call) -> dict:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), str):
        rule = "{'id', 'type': 'function', 'function': {'name', 'arguments' (JSON text)}}"
        raise InvalidRequest(f"'messages[{i}].tool_calls' items must be {rule}", param="messages")
    call_id = call.get("id") if isinstance(call.get("id"), str) else ""
    return {"id": call_id, "type": "function", "function": {"name": fn["name"], "arguments": fn["arguments"]}}


def _message(i: int, message) -> dict:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise InvalidRequest(f"'messages[{i}]' must be an object with a 'role'", param="messages")
    role, calls = message["role"], message.get("tool_calls")
    if calls is not None and (role != "assistant" or not isinstance(calls, list)):
        raise InvalidRequest(f"'messages[{i}].tool_calls' must be a list, on an assistant message", param="messages")
    out = {"role": role, "content": _text(i, message.get("content"), nullable=bool(calls))}
    if calls:
        out["tool_calls"] = [_tool_call(i, call) for call in calls]
    if role == "tool":
        if not isinstance(message.get("tool_call_id"), str):
            raise InvalidRequest(f"'messages[{i}]': a tool message needs its 'tool_call_id'", param="messages")
        out["tool_call_id"] = message["tool_call_id"]
    return out


def messages(messages) -> list[dict]:
    """The messages as the chat template reads them: role and text content, and an assistant's
    `tool_calls` or a tool message's `tool_call_id`."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list", param="messages")
    return [_message(i, m) for i, m in enumerate(messages)]


@functools.cache
def _template_file(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


@functools.cache
def reads_tools(template: str) -> bool:
    """Whether a chat template renders `tools` (it names the variable)."""
    try:
        return "tools" in jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(template))
    except jinja2.TemplateSyntaxError:  # a tag of transformers' own (`{% generation %}`): read the text
        return "tools" in template


def render(messages: list[dict], tools: Tools | None = None, *, add_generation_prompt: bool = True) -> str:
    """The chat template (CHAT_TEMPLATE's, or the model's own), the same rendering for both
    engines (and /tokenize); `tools`: the request's, when it has some."""
    tokenizer = current_app.extensions["tokenizer"]()
    path = current_app.config["SERVICE"].chat_template
    template = _template_file(path) if path else tokenizer.chat_template
    if not template:
        raise InvalidRequest("this model has no chat template: use /completions with a prompt", param="messages")
    kwargs = {"tokenize": False, "add_generation_prompt": add_generation_prompt, "chat_template": template}
    if reads_tools(template):
        tool_list = tool_prompt.openai_tools(tools) if tools is not None and tools.constrained else None
        return tokenizer.apply_chat_template(messages, tools=tool_list, **kwargs)
    return tokenizer.apply_chat_template(tool_prompt.plain(messages, tools), **kwargs)


def head(messages: list[dict], tools: Tools | None = None) -> str:
    """The start of the rendering that a cut must leave whole (service/context.py): everything
    before the first non-system message's content, i.e. the system turn and the user's role
    marker (and, with tools, the turn that states them), found by rendering that message with a
    marker for its content."""
    first = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages) - 1)
    marker = "\x00head\x00"  # text no message has (a NUL is refused nowhere, but no one sends it)
    marked = [*messages[:first], {**messages[first], "content": marker}]
    rendered = render(marked, tools, add_generation_prompt=False)
    return rendered[: rendered.index(marker)] if marker in rendered else ""
