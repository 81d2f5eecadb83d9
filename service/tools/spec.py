"""A request's function tools, parsed once, and the grammar its reply is constrained to.

Tool calls are structured outputs with a prompt (docs: the tool format): the tools are stated in
the prompt (service/tools/prompt.py), and the reply is constrained, by the same xgrammar machinery
as `structured_outputs` (service/structured.py), to one JSON object in llama.cpp's "generic" shape:
- `{"tool_call":{"name":...,"arguments":{...}}}`: a call, its arguments from the function's
  `parameters` schema;
- `{"response":"..."}`: a text answer (`tool_choice: "auto"` only).
What each `tool_choice` guarantees: `"none"`: no constraint, no tools in the prompt; a named
function: a call of that function; `"required"`: a call of one of the tools; `"auto"`: a call
of one of the tools or a text answer. One call per reply whatever `parallel_tool_calls` says
(it is accepted: one call is what `false` asks, and what `true` allows).

Arguments end: JSON is compact on both engines, and each string or array whose schema sets no
bound gets one here (STRING_MAX_LENGTH, ARRAY_MAX_ITEMS), so that no argument can run on until
`max_tokens`. A request with tools that names no max_tokens gets TOOL_MAX_TOKENS, room for a call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from batcher.grammar import StructuredSpec
from service.config import Config
from service.errors import InvalidRequest
from service.structured import schema_text

TOOL_MAX_TOKENS = 128  # the default max_tokens of a request with tools (MAX_NEW_TOKENS is 20)
STRING_MAX_LENGTH = 100  # characters, for a string argument whose schema sets no maxLength
ARRAY_MAX_ITEMS = 16  # for an array argument whose schema sets no maxItems
NO_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Tools:
    """`functions`: name -> {"name", "description", "parameters"}, in the request's order;
    `choice`: "none", "auto", "required" or "named"; `named`: the function a named choice calls."""

    functions: dict[str, dict]
    choice: str = "auto"
    named: str | None = None

    @property
    def constrained(self) -> bool:
        return self.choice != "none"


def _bad(why: str, param: str = "tools") -> InvalidRequest:
    return InvalidRequest(why, param=param)


def _function(i: int, name: str, description: str | None, parameters: dict | None) -> dict:
    """Its shape checked by the request's model (its protocol.py); here, what only a schema check says."""
    parameters = parameters or NO_PARAMETERS
    schema_text(parameters, "tools")  # a valid JSON schema that xgrammar enforces, or a 400
    if parameters.get("type") != "object":
        raise _bad(f"'tools[{i}].function.parameters' must be a JSON schema of type 'object'")
    return {"name": name, "description": description or "", "parameters": parameters}


def collect(
    functions: list[tuple[str, str | None, dict | None]], choice: str | None, named: str | None
) -> Tools | None:
    """A request's tools, as (name, description, parameters) in its order, and its `tool_choice`
    ("none", "auto", "required", or "named" with the function's name in `named`); None without
    tools. Chat and Responses spell them differently (service/openai/chat/protocol.py, responses.py)."""
    if not functions:
        if choice not in (None, "none"):
            raise _bad("'tool_choice' needs 'tools'", "tool_choice")
        return None
    parsed: dict[str, dict] = {}
    for i, (name, description, parameters) in enumerate(functions):
        if name in parsed:
            raise _bad(f"'tools[{i}].function.name': '{name}' is declared twice")
        parsed[name] = _function(i, name, description, parameters)
    if choice != "named":
        return Tools(parsed, choice or "auto")
    if named not in parsed:
        raise _bad(f"'tool_choice' names '{named}', which is not among 'tools'", "tool_choice")
    return Tools(parsed, "named", named)


def bounded(schema):
    """The schema with a maxLength on every free string and a maxItems on every array that has
    none (a copy): a string or array of a 135M model's making can otherwise run to max_tokens."""
    if isinstance(schema, list):
        return [bounded(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: bounded(value) for key, value in schema.items() if key not in ("const", "enum", "default", "examples")}
    out.update({key: schema[key] for key in ("const", "enum", "default", "examples") if key in schema})
    kinds = schema.get("type") if isinstance(schema.get("type"), list) else [schema.get("type")]
    free = not any(key in schema for key in ("const", "enum", "pattern", "format"))
    if "string" in kinds and free and "maxLength" not in schema:
        out["maxLength"] = STRING_MAX_LENGTH
    if "array" in kinds and "maxItems" not in schema:
        out["maxItems"] = ARRAY_MAX_ITEMS
    return out


def _call(fn: dict) -> dict:
    properties = {"name": {"const": fn["name"]}, "arguments": bounded(fn["parameters"])}
    call = {"type": "object", "properties": properties, "required": ["name", "arguments"]}
    return {**call, "additionalProperties": False}


def reply_schema(tools: Tools) -> dict:
    """The JSON schema of the reply: {"tool_call": ...}, or under "auto" that or {"response": ...}."""
    names = [tools.named] if tools.choice == "named" else list(tools.functions)
    calls = [_call(tools.functions[name]) for name in names]
    call = calls[0] if len(calls) == 1 else {"anyOf": calls}
    wrapped = {"type": "object", "properties": {"tool_call": call}, "required": ["tool_call"]}
    wrapped["additionalProperties"] = False
    if tools.choice != "auto":
        return wrapped
    text = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]}
    return {"anyOf": [wrapped, {**text, "additionalProperties": False}]}


def reply_grammar(tools: Tools | None) -> StructuredSpec | None:
    """The reply's grammar (a JSON schema), not compiled yet: service/generation.py compiles it
    once the request would be admitted, and a schema xgrammar refuses is then a 400 naming
    `tools`; None where the reply is free."""
    if tools is None or not tools.constrained:
        return None
    return StructuredSpec("json", json.dumps(reply_schema(tools)), param="tools")


def default_max_tokens(config: Config | None) -> int:
    """The max_tokens of a request whose tools constrain the reply and that names none: room for a call."""
    return TOOL_MAX_TOKENS if config is None else min(TOOL_MAX_TOKENS, config.max_new_tokens_limit)
