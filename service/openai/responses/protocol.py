"""`POST /v1/responses` (and `/static/v1/responses`): OpenAI's Responses API, read as
the chat request it means: `input` items and `instructions` become the messages, `tools` and
`tool_choice` the same function tools, `text.format` the reply's constraint. Fields outside this
model are service/openai/responses.py's table (`check`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, model_validator

from batcher.grammar import StructuredSpec
from batcher.sampling import SamplingParams
from service import structured
from service.config import Config
from service.errors import InvalidRequest
from service.openai.chat.protocol import Part
from service.openai.protocol import OPEN, FunctionName, MaxTokens
from service.protocol.limits import MAX_MESSAGES, MAX_TOOLS
from service.protocol.sampling import Flag, Number, Strict
from service.tools import spec as tool_spec

ITEM_RULE = "a message ({role, content}), a function_call or a function_call_output"


class InputPart(Part):
    type: Literal["input_text", "output_text"]


class InputItem(Strict):
    """A message, a function_call or a function_call_output (service/openai/responses.py)."""

    model_config = OPEN
    type: Literal["message", "function_call", "function_call_output"] | None = None
    role: str | None = None
    content: str | list[InputPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None


class ResponsesTool(Strict):
    model_config = OPEN
    type: Literal["function"]
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: Flag | None = None


class NamedFunction(Strict):
    """Responses' spelling of a named tool_choice."""

    model_config = OPEN
    type: Literal["function"]
    name: str


class TextFormat(Strict):
    model_config = OPEN
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: Flag | None = None


class TextConfig(Strict):
    model_config = ConfigDict(extra="forbid")
    format: TextFormat | None = None


def conversation(items: list[InputItem]) -> list[dict]:
    """The chat messages `items` mean: a message item is a turn (`developer` a system one),
    function calls in a row are one assistant turn, a call's output a tool turn."""
    messages: list[dict] = []
    for i, item in enumerate(items):
        kind = item.type or "message"
        if kind == "message" and item.role is not None and item.content is not None:
            role = "system" if item.role == "developer" else item.role
            content = item.content if isinstance(item.content, str) else "".join(p.text for p in item.content)
            messages.append({"role": role, "content": content})
        elif kind == "function_call" and None not in (item.call_id, item.name, item.arguments):
            call = {"id": item.call_id, "type": "function"}
            call["function"] = {"name": item.name, "arguments": item.arguments}
            if messages and messages[-1].get("tool_calls"):  # calls in a row: one assistant turn
                messages[-1]["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output" and None not in (item.call_id, item.output):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
        else:
            needs = {"message": "role, content", "function_call": "call_id, name, arguments"}
            fields = needs.get(kind, "call_id, output")
            raise InvalidRequest(f"'input[{i}]' must be {ITEM_RULE}; a {kind} needs {fields}", param="input")
    return messages


AS_SENT = AliasChoices("include", "include[]")  # the openai SDK sends a list with brackets


class ItemList(BaseModel):
    """`GET /responses/{id}/input_items`: OpenAI's cursor page."""

    model_config = ConfigDict(extra="forbid")
    after: str | None = Field(None, description="an item id: the items past it, in this order")
    limit: int = Field(20, ge=1, le=100)
    order: Literal["asc", "desc"] = Field("desc", description="desc: the newest item first")
    include: str | None = Field(None, description="ignored: an item carries its content", validation_alias=AS_SENT)


class Retrieve(BaseModel):
    """`GET /responses/{id}`: the response, or (a background one) its events again."""

    model_config = ConfigDict(extra="forbid")
    stream: bool = Field(False, description="its events: those past starting_after, then each new one")
    starting_after: int | None = Field(None, ge=-1, description="a sequence_number: the events after it")
    include: str | None = Field(None, description="ignored: a response carries its output", validation_alias=AS_SENT)
    include_obfuscation: bool | None = Field(None, description="ignored: no obfuscation is added")


class Responses(Strict):
    """`POST /v1/responses`: every field outside these (and responses.IGNORED) is a 400."""

    model_config = OPEN
    model: str | None = None
    input: str | Annotated[list[InputItem], Field(min_length=1, max_length=MAX_MESSAGES)]
    instructions: str | None = Field(None, description="a system turn first")
    max_output_tokens: MaxTokens | None = None
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = None
    top_p: Annotated[Number, Field(gt=0, le=1)] | None = None
    text: TextConfig | None = None
    tools: Annotated[list[ResponsesTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: Flag | None = None
    stream: Flag | None = None

    store: Flag | None = Field(None, description="kept RESPONSE_RETENTION_S (30 days), to read and continue")
    previous_response_id: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    truncation: Literal["auto", "disabled"] | None = Field(None, description="auto: drop the oldest turns to fit")
    background: Flag | None = Field(None, description="answer at once (queued); a worker runs it, stored")

    _template_messages: list[dict] = PrivateAttr(default_factory=list)
    _tools: tool_spec.Tools | None = PrivateAttr(None)
    _spec: StructuredSpec | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _across_fields(self, info: ValidationInfo):
        if self.background and self.store is False:
            raise InvalidRequest("'background' responses are stored: leave 'store' true", param="background")
        self._template_messages = self._messages()
        functions = [(t.name, t.description, t.parameters) for t in self.tools or []]
        named = self.tool_choice.name if isinstance(self.tool_choice, NamedFunction) else None
        self._tools = tool_spec.collect(functions, self.tool_choice if named is None else "named", named)
        self._spec = self._constraint()
        return self

    def _messages(self) -> list[dict]:
        """The chat messages the request means on its own: `instructions` a system turn, then
        its input's (`conversation`)."""
        first = [] if self.instructions is None else [{"role": "system", "content": self.instructions}]
        return [*first, *conversation(self.items)]

    @property
    def items(self) -> list[InputItem]:
        """The input as items: a string is one user message."""
        return [InputItem(role="user", content=self.input)] if isinstance(self.input, str) else self.input

    def own_items(self) -> list[dict]:
        """This turn's input items as the store keeps them (service/openai/responses/stored.py)."""
        return [item.model_dump(exclude_none=True) for item in self.items]

    def messages_after(self, history: list[dict]) -> list[dict]:
        """The chat messages of this turn after `history` (the stored items of the turns before
        it, service/openai/responses/stored.py): the earlier turns' `instructions` are not carried."""
        if not history:
            return self._template_messages
        first = [] if self.instructions is None else [{"role": "system", "content": self.instructions}]
        return [*first, *conversation([*map(InputItem.model_validate, history), *self.items])]

    def _constraint(self) -> StructuredSpec | None:
        """`text.format`, or the grammar that `tool_choice` asks for, never both."""
        fmt = self.text.format if self.text is not None else None
        free = fmt is None or fmt.type == "text"
        if self._tools is not None and self._tools.constrained:
            if not free:
                message = "'text.format' cannot constrain a reply that 'tool_choice' already constrains"
                raise InvalidRequest(message, param="text")
            return tool_spec.reply_grammar(self._tools)
        if free:
            return None
        if fmt.type == "json_object":
            return StructuredSpec("json_object", param="text")
        if fmt.schema_ is None:
            raise InvalidRequest("'text.format' of type 'json_schema' needs its 'schema'", param="text")
        return StructuredSpec("json", structured.schema_text(fmt.schema_, "text"), param="text")

    @property
    def template_messages(self) -> list[dict]:
        return self._template_messages

    @property
    def function_tools(self) -> tool_spec.Tools | None:
        return self._tools

    def token_budget(self, config: Config) -> int:
        if self.max_output_tokens is not None:
            return self.max_output_tokens
        if self._tools is not None and self._tools.constrained:
            return tool_spec.default_max_tokens(config)
        return config.max_new_tokens

    def to_sampling_params(self, config: Config) -> SamplingParams:
        """OpenAI's defaults: temperature 1, top_p 1."""
        given = {name: getattr(self, name) for name in ("temperature", "top_p") if getattr(self, name) is not None}
        return SamplingParams(
            **{"temperature": 1.0, **given}, max_tokens=self.token_budget(config), structured=self._spec
        )
