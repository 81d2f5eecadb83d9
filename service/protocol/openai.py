"""The OpenAI routes' bodies, both engines: `/completions`, `/chat/completions`, `/responses`,
`/tokenize`, `/detokenize`. vLLM's rule (its OpenAIBaseModel): extra="allow", a name nobody
defined is logged at debug and ignored; the fields OpenAI or vLLM define and we do not implement
are refused or ignored by service/openai/fields.py's table, which takes its honoured fields
from these models. What the shapes mean: docs/openai.md."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, create_model, field_validator
from pydantic_core import PydanticCustomError

from service.protocol.demo import Prompt
from service.protocol.limits import MAX_MESSAGES, MAX_TOOLS, AtMost
from service.protocol.sampling import Flag, Int, Logprobs, Number, Sampling, Strict, TokenIds

OPEN = ConfigDict(extra="allow")
MaxTokens = Annotated[Int, Field(ge=1), AtMost("max_new_tokens_limit")]
TooMany = AtMost("max_prompts_per_request", too_many=True)
LOGPROBS = ("logprobs", "top_logprobs")
PROMPT_RULE = "a string, a list of strings, a list of token ids, or a list of lists of token ids"
FunctionName = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]  # OpenAI's rule


class StreamOptions(Strict):
    model_config = OPEN
    include_usage: Flag | None = None
    continuous_usage_stats: Flag | None = None


class OpenAIBody(Sampling):
    model_config = OPEN
    model: str | None = Field(None, description="the served model's id (GET /v1/models), or leave it out")
    stream: Flag | None = None
    stream_options: StreamOptions | None = Field(None, description="only with stream: true")
    prompt_logprobs: Logprobs | None = Field(None, description="vLLM's: top alternatives per prompt token")
    echo: Flag | None = None


class Completion(OpenAIBody):
    """`POST /v1/completions`: a string, strings, token ids or lists of them."""

    prompt: (
        Prompt
        | Annotated[list[Prompt], Field(min_length=1), TooMany]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1), TooMany]
    )
    max_tokens: Annotated[Int, Field(ge=0), AtMost("max_new_tokens_limit")] | None = Field(
        None, description="0 only with echo (the prompt alone)"
    )

    @field_validator("prompt", mode="before")
    @classmethod
    def _shape(cls, value):
        """What is wrong, in the prompt's own terms, where a value is none of its shapes (the
        union's own errors name every member); the union then checks what passes."""
        if isinstance(value, str) or (isinstance(value, list) and value and all(isinstance(p, str) for p in value)):
            return value
        if not isinstance(value, list) or not value:
            raise PydanticCustomError("prompt", f"must be {PROMPT_RULE} (and not empty)")
        for i, ids in enumerate(value if all(isinstance(p, list) for p in value) else [value]):
            if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
                raise PydanticCustomError("prompt", f"must be {PROMPT_RULE}; token ids are integers >= 0")
            if not ids:
                raise PydanticCustomError("prompt", f"prompt {i} is an empty list of token ids")
        return value


class Part(Strict):
    """A content part: text is all this model reads."""

    model_config = OPEN
    type: Literal["text"]
    text: str


class InputPart(Part):
    type: Literal["input_text", "output_text"]


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


Messages = Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]


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


class NamedFunction(Strict):
    """Responses' spelling of a named tool_choice."""

    model_config = OPEN
    type: Literal["function"]
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


# chat's spelling of logprobs alone, for service/params.py's chat_logprobs
ChatLogprobs = create_model(
    "ChatLogprobs", __base__=Strict, **{k: (Chat.model_fields[k].annotation, Chat.model_fields[k]) for k in LOGPROBS}
)


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


class TextFormat(Strict):
    model_config = OPEN
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: Flag | None = None


class TextConfig(Strict):
    model_config = ConfigDict(extra="forbid")
    format: TextFormat | None = None


class Responses(Strict):
    """`POST /v1/responses`, stateless: every field outside these (and responses.IGNORED) is a 400."""

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


class TokenizeText(Strict):
    """`POST /tokenize`, `/static/tokenize` with a prompt (vLLM's TokenizeCompletionRequest)."""

    model_config = OPEN
    model: str | None = None
    prompt: Annotated[str, Field(min_length=1)]
    add_special_tokens: Flag | None = None
    return_token_strs: Flag | None = None


class TokenizeChat(Strict):
    """`POST /tokenize` with messages (vLLM's TokenizeChatRequest), rendered as the chat route does."""

    model_config = OPEN
    model: str | None = None
    messages: Messages
    add_generation_prompt: Flag | None = None
    add_special_tokens: Flag | None = None
    return_token_strs: Flag | None = None


class Detokenize(Strict):
    model_config = OPEN
    model: str | None = None
    tokens: TokenIds
