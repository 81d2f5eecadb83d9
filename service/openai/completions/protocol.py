"""`POST /v1/completions` (and `/static/v1/completions`): a string, strings, token ids or lists
of them, vLLM's and OpenAI's fields (service/openai/protocol.py has what it shares with chat)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from batcher.sequence import Prompt as EnginePrompt
from service.config import Config
from service.errors import InvalidRequest
from service.openai.protocol import OpenAIBody
from service.protocol.limits import AtMost
from service.protocol.prompt import Prompt
from service.protocol.sampling import Int, TokenIds

TooMany = AtMost("max_prompts_per_request", too_many=True)
PROMPT_RULE = "a string, a list of strings, a list of token ids, or a list of lists of token ids"


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

    def check_across_fields(self, config: Config | None) -> None:
        if self.max_tokens == 0 and not self.echo:
            raise InvalidRequest("'max_tokens': input should be greater than or equal to 1, got 0", param="max_tokens")
        super().check_across_fields(config)

    @property
    def echo_only(self) -> bool:
        """`echo` with `max_tokens: 0`: the reply holds the prompt alone."""
        return bool(self.echo) and self.max_tokens == 0

    def token_budget(self, config: Config | None) -> int | None:
        """As vLLM: `max_tokens: 0` with echo makes one token, which the reply leaves out."""
        return 1 if self.echo_only else super().token_budget(config)

    def prompts(self) -> list[EnginePrompt]:
        """The prompts as a list; token ids become tuples (whether they are in the vocabulary only
        the engine knows, EngineThread._check_token_ids)."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        return [tuple(ids) for ids in ([prompt] if all(isinstance(t, int) for t in prompt) else prompt)]
