"""`POST /v1/chat/completions` (and `/static/v1/...`): messages, function tools, chat's spelling
of logprobs and of max_tokens; the messages' shapes are `/tokenize`'s too (tokenize.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, PrivateAttr

from batcher.grammar import StructuredSpec
from service.config import Config
from service.errors import InvalidRequest
from service.openai.protocol import OPEN, FunctionName, MaxTokens, OpenAIBody
from service.protocol.limits import MAX_MESSAGES, MAX_TOOLS
from service.protocol.sampling import Flag, Logprobs, Strict
from service.tools import spec as tool_spec


class Part(Strict):
    """A content part: text is all this model reads."""

    model_config = OPEN
    type: Literal["text"]
    text: str


class FunctionCall(Strict):
    name: str
    arguments: str = Field(description="JSON text")


class ToolCall(Strict):
    model_config = OPEN
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCall


class Message(Strict):
    model_config = OPEN
    role: str
    content: str | list[Part] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def check(self, i: int) -> None:
        """What spans the message's fields; `i`: its place, for the error."""
        if self.tool_calls is not None and self.role != "assistant":
            raise InvalidRequest(
                f"'messages[{i}].tool_calls' must be a list, on an assistant message", param="messages"
            )
        if self.content is None and not self.tool_calls:
            raise InvalidRequest(f"'messages[{i}].content' must be a string or a list of text parts", param="messages")
        if self.role == "tool" and self.tool_call_id is None:
            raise InvalidRequest(f"'messages[{i}]': a tool message needs its 'tool_call_id'", param="messages")

    def for_template(self) -> dict:
        """As the chat template reads it: role and text content, and an assistant's `tool_calls`
        or a tool message's `tool_call_id`."""
        content = self.content
        if isinstance(content, list):  # content parts: only text ones have meaning for this model
            content = "".join(part.text for part in content)
        out = {"role": self.role, "content": content}
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": call.id or "", "type": "function", "function": call.function.model_dump()}
                for call in self.tool_calls
            ]
        if self.role == "tool":
            out["tool_call_id"] = self.tool_call_id
        return out


Messages = Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]


def check_messages(messages: list[Message]) -> list[dict]:
    """The messages as the chat template reads them, each one's cross-field rules checked."""
    for i, message in enumerate(messages):
        message.check(i)
    return [message.for_template() for message in messages]


class Function(Strict):
    model_config = ConfigDict(extra="forbid")
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="a JSON schema of type object")
    strict: Flag | None = None


class Tool(Strict):
    model_config = OPEN
    type: Literal["function"]
    function: Function


class Named(Strict):
    name: str


class NamedChoice(Strict):
    model_config = OPEN
    type: Literal["function"]
    function: Named


Choice = Literal["none", "auto", "required"] | NamedChoice


class Chat(OpenAIBody):
    """`POST /v1/chat/completions`."""

    messages: Messages
    logprobs: Flag | None = Field(None, description="true: the chosen tokens' logprobs")
    top_logprobs: Logprobs | None = Field(None, description="alternatives per token; needs logprobs: true")
    max_completion_tokens: MaxTokens | None = Field(None, description="wins over max_tokens")
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Choice | None = None
    parallel_tool_calls: Flag | None = None

    _template_messages: list[dict] = PrivateAttr(default_factory=list)
    _tools: tool_spec.Tools | None = PrivateAttr(None)

    def check_across_fields(self, config: Config | None) -> None:
        """The messages, the tools and `tool_choice`, logprobs, then what every OpenAI body checks."""
        self._template_messages = check_messages(self.messages)
        functions = [(t.function.name, t.function.description, t.function.parameters) for t in self.tools or []]
        named = self.tool_choice.function.name if isinstance(self.tool_choice, NamedChoice) else None
        self._tools = tool_spec.collect(functions, self.tool_choice if named is None else "named", named)
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequest("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        super().check_across_fields(config)

    @property
    def template_messages(self) -> list[dict]:
        return self._template_messages

    @property
    def function_tools(self) -> tool_spec.Tools | None:
        """The request's tools, parsed (service/tools/spec.py); None without tools."""
        return self._tools

    def constraint(self, config: Config | None) -> StructuredSpec | None:
        """The reply's grammar that `tool_choice` asks for, where it constrains; else the body's."""
        if self._tools is None or not self._tools.constrained:
            return super().constraint(config)
        formats = {"response_format": self.response_format, "structured_outputs": self.structured_outputs}
        for field, value in formats.items():
            if value is not None and getattr(value, "type", None) != "text":
                message = f"'{field}' cannot constrain a reply that 'tool_choice' already constrains"
                raise InvalidRequest(message, param=field)
        return tool_spec.reply_grammar(self._tools)

    def token_budget(self, config: Config | None) -> int | None:
        """`max_completion_tokens` wins over `max_tokens`, as on vLLM; with tools that constrain
        the reply, TOOL_MAX_TOKENS where neither is named (room for a call)."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        if self.max_tokens is None and self._tools is not None and self._tools.constrained:
            return tool_spec.default_max_tokens(config)
        return super().token_budget(config)

    def sampled_logprobs(self) -> int | None:
        """Chat's `logprobs: true` + `top_logprobs: k` as the one number the engines take."""
        return (self.top_logprobs or 0) if self.logprobs else None
