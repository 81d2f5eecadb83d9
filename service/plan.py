"""What one generate request runs, decided once from its validated body: a frozen `Plan`.

Each API builds its plan from its request model (service/protocol/) and what the view looked up
in the app (`Served`): openai/completion.py, openai/chat.py, openai/responses.py, demo/serving.py.
The code after it reads the plan and rewrites nothing: the engines take `prompts` and `params`
(service/generation.py), the reply shapes take the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from batcher.sampling import SamplingParams
from batcher.sequence import Prompt
from service.config import Config
from service.errors import ModelNotFound

if TYPE_CHECKING:
    from service.openai.echo import Echo
    from service.tools.spec import Tools


@dataclass(frozen=True)
class Served:
    """What a request is planned against, looked up once per request by its view
    (service/http/lookup.py): the settings and the model's tokenizer (chat template included)."""

    config: Config
    tokenizer: Any

    def check_model(self, asked: str | None) -> str:
        """The served model's name, where a request (the OpenAI routes' `model`) names it or leaves it out."""
        served = self.config.model_name
        if asked is not None and asked != served:
            raise ModelNotFound(f"the model '{asked}' does not exist; this service serves '{served}'", param="model")
        return served


@dataclass(frozen=True)
class Plan:
    """`prompts`: as the engines run them (each checked against the context length, cut where the
    request asked, service/context_length.py); `params`: their sampling parameters, the grammar not yet
    compiled (service/generation.py compiles it once the engine would admit the request); `n`:
    completions per prompt; `stream`, `include_usage`, `continuous_usage`: how the reply is sent;
    `echo`: what each choice starts with (OpenAI's `echo`); `tools`: the request's function tools,
    which the reply is read against; `details`: our batching extension; `max_queue_ms`: the
    body's deadline for the first token (X-Max-Queue-Ms may lower it)."""

    prompts: tuple[Prompt, ...]
    params: SamplingParams
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    echo: Echo | None = None
    tools: Tools | None = None
    details: bool = False
    max_queue_ms: float | None = None

    @property
    def logprobs(self) -> bool:
        """Whether the reply carries the generated tokens' logprobs."""
        return self.params.logprobs is not None
