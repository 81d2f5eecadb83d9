"""A prompt as text: what the demo bodies' `prompt(s)` and /completions' string prompts share."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError


def _has_text(prompt: str) -> str:
    if not prompt.strip():
        raise PydanticCustomError("empty_prompt", "is empty")
    return prompt


# JSON Schema's pattern searches: some character that is not white space
Prompt = Annotated[str, Field(strict=True, json_schema_extra={"pattern": r"\S"}), AfterValidator(_has_text)]
