"""The demo API's request bodies: our own API, so a field outside them is a typo (extra="forbid":
a 400 `unknown_field` naming it, service/protocol/__init__.py). `/generate` and `/generate_vllm`
take `prompts`; `/basic_generate` and the two streams one `prompt`; `/race` the page's feed.
Validation and `to_sampling_params` only: the plan is serving.py's."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from service.protocol.limits import AtMost
from service.protocol.prompt import Prompt
from service.protocol.sampling import Int, Sampling

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
