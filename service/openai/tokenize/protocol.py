"""vLLM's `/tokenize` and `/detokenize` bodies (and `/static/...`): a prompt, or messages rendered
as the chat route renders them; token ids back to text."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, PrivateAttr, ValidationInfo, model_validator

from service.openai.chat.protocol import Messages, check_messages
from service.openai.protocol import OPEN
from service.protocol.sampling import Flag, Strict, TokenIds


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

    _template_messages: list[dict] = PrivateAttr(default_factory=list)

    @model_validator(mode="after")
    def _across_fields(self, info: ValidationInfo):
        self._template_messages = check_messages(self.messages)
        return self

    @property
    def template_messages(self) -> list[dict]:
        return self._template_messages


class Detokenize(Strict):
    model_config = OPEN
    model: str | None = None
    tokens: TokenIds
