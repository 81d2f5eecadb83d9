"""The demo routes' bodies: our own API, so a field outside them is a typo (extra="forbid": a 400
`unknown_field` naming it, service/protocol/__init__.py). `/generate` and `/generate_vllm` take
`prompts`; `/basic_generate` and the two streams one `prompt`; `/race` the page's feed."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

from service.protocol.limits import AtMost
from service.protocol.sampling import Int, Sampling


def _has_text(prompt: str) -> str:
    if not prompt.strip():
        raise PydanticCustomError("empty_prompt", "is empty")
    return prompt


# JSON Schema's pattern searches: some character that is not white space
Prompt = Annotated[str, Field(strict=True, json_schema_extra={"pattern": r"\S"}), AfterValidator(_has_text)]
Prompts = Annotated[list[Prompt], AtMost("max_prompts_per_request", too_many=True)]


class Generate(Sampling):
    """`POST /generate`, `/generate_vllm`: every prompt n times, greedy unless asked."""

    model_config = ConfigDict(extra="forbid")
    prompts: Prompts = Field(description="the prompts, in order; [] answers []")


class Single(Sampling):
    """`POST /basic_generate`, `/generate_stream`, `/generate_vllm_stream`: one prompt, one text."""

    model_config = ConfigDict(extra="forbid")
    prompt: Prompt
    n: Annotated[Int, Field(ge=1, le=1)] | None = Field(None, description="1: use /generate for more")


class Race(Generate):
    """`POST /race`: the race page's feed, one engine's prompts sent the chosen way (service/demo/race.py)."""

    engine: Literal["static", "vllm"]
    mode: Literal["concurrent", "batch"] | None = None
