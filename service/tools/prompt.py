"""The tools in the prompt, for a chat template that has no tool format of its own (SmolLM2's):
our format, stated in the system turn, and the tool turns of the history written in it.

The system turn gets, after its own text (or the template's default one):

    You can call these functions. Each line is one, with the JSON schema of its arguments:
    {"name":"get_weather","description":"...","parameters":{...}}
    To call a function, reply with only {"tool_call":{"name":"<its name>","arguments":{...}}}.
    To answer in text, reply with only {"response":"<your answer>"}.       (tool_choice auto)

An assistant turn that called a tool is written as the call it made, in that shape, and a
`tool` turn as a user turn: `Result of <name>: <content>`, so that a template that knows only
system, user and assistant turns renders a whole tool conversation. A template that reads
`tools` itself (a model's own, or CHAT_TEMPLATE's) gets the tools and the messages as they are.
"""

from __future__ import annotations

import json

from service.tools.spec import Tools

COMPACT = (",", ":")
HEADER = "You can call these functions. Each line is one, with the JSON schema of its arguments:"
CALL = 'To call a function, reply with only {"tool_call":{"name":"<its name>","arguments":{...}}}.'
NAMED = 'Call the function "{name}": reply with only {{"tool_call":{{"name":"{name}","arguments":{{...}}}}}}.'
TEXT = 'To answer in text, reply with only {"response":"<your answer>"}.'


def openai_tools(tools: Tools) -> list[dict]:
    """The tools as a chat template that reads `tools` takes them (OpenAI's shape)."""
    return [{"type": "function", "function": fn} for fn in tools.functions.values()]


def system_text(tools: Tools) -> str:
    lines = [HEADER, *(json.dumps(fn, separators=COMPACT, ensure_ascii=False) for fn in tools.functions.values())]
    if tools.choice == "named":
        lines.append(NAMED.format(name=tools.named))
    else:
        lines.append(CALL)
    if tools.choice == "auto":
        lines.append(TEXT)
    return "\n".join(lines)


def call_text(call: dict) -> str:
    """One call of an assistant turn in our reply format (its arguments parsed where they parse)."""
    fn = call["function"]
    try:
        arguments = json.loads(fn["arguments"])
    except (TypeError, json.JSONDecodeError):
        arguments = fn["arguments"]
    return json.dumps({"tool_call": {"name": fn["name"], "arguments": arguments}}, separators=COMPACT)


def plain(messages: list[dict], tools: Tools | None) -> list[dict]:
    """The messages with the tools stated in the system turn (when the reply is constrained) and
    the tool turns written in our format: system, user and assistant turns only."""
    names = {call["id"]: call["function"]["name"] for m in messages for call in m.get("tool_calls") or ()}
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = "\n".join(call_text(call) for call in m["tool_calls"])
            out.append({"role": "assistant", "content": calls})
        elif m["role"] == "tool":
            name = names.get(m.get("tool_call_id"), "the function")
            out.append({"role": "user", "content": f"Result of {name}: {m['content']}"})
        else:
            out.append({"role": m["role"], "content": m["content"] or ""})
    if tools is None or not tools.constrained:
        return out
    if out and out[0]["role"] == "system":
        return [{"role": "system", "content": f"{out[0]['content']}\n\n{system_text(tools)}"}, *out[1:]]
    return [{"role": "system", "content": system_text(tools)}, *out]
