"""What the OpenAI APIs' bodies share (`/completions`, `/chat/completions`, both engines): the
stream options, the echo and vLLM's prompt logprobs; each API's own model is its folder's
protocol.py. vLLM's rule (its OpenAIBaseModel): extra="allow", a name nobody defined is logged at
debug and ignored; the fields OpenAI or vLLM define and we do not implement are refused or
ignored by service/openai/fields.py's tables, which take their honoured fields from these models.
What the shapes mean: docs/openai.md."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import ConfigDict, Field

from service.config import Config
from service.errors import InvalidRequest
from service.protocol.limits import AtMost
from service.protocol.sampling import Flag, Int, Logprobs, Sampling, Strict

OPEN = ConfigDict(extra="allow")
MaxTokens = Annotated[Int, Field(ge=1), AtMost("max_new_tokens_limit")]
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

    DEFAULT_TEMPERATURE: ClassVar[float] = 1.0  # OpenAI's

    def check_across_fields(self, config: Config | None) -> None:
        """How the reply is sent, then the sampling rules."""
        options = self.stream_options
        if options is not None and not self.stream:
            raise InvalidRequest("'stream_options' is only allowed with 'stream': true", param="stream_options")
        if options is not None and options.continuous_usage_stats and not options.include_usage:
            # vLLM would send no usage at all: say so instead
            message = "'stream_options.continuous_usage_stats' needs 'stream_options.include_usage': true"
            raise InvalidRequest(message, param="stream_options")
        if self.stream and self.details:  # the batching object rides on whole replies only
            raise InvalidRequest("'details' is not supported with 'stream': true", param="details")
        if self.stream and self.prompt_logprobs:  # vLLM's rule: chunks carry no prompt logprobs (0 asks for none)
            raise InvalidRequest("'prompt_logprobs' are not available with 'stream': true", param="prompt_logprobs")
        super().check_across_fields(config)
