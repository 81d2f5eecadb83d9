"""The sampling fields every generate body shares (demo and OpenAI routes, both engines), declared
once: types and ranges here, vLLM's; what they mean in docs/api.md's table, which
tests/unit/test_bodies.py checks against these declarations.

Strict, as JSON is: a JSON true is not the number 1, "5" is not 5, 2.0 is not an integer; NaN
and Infinity (which Python's JSON parser reads) are no numbers. Absent or null: the default
(`to_sampling_params` fills it in). The bounds that are settings are `AtMost` (limits.py).

Rules that span fields are the model's own validator (`_across_fields`), run once the fields are
valid; each raises the API's `InvalidRequest` naming the field (pydantic's error for a model
validator names none). The validation context carries the app's `Config` (service/protocol/
__init__.py's `validate`); without one (a unit test), the rules that need a setting are skipped.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError

from batcher.grammar import StructuredSpec
from batcher.sampling import SamplingParams
from service import structured
from service.config import Config
from service.errors import InvalidRequest
from service.protocol.limits import (
    MAX_CHOICE_CHARS,
    MAX_CHOICES,
    MAX_GRAMMAR_CHARS,
    MAX_LOGIT_BIAS,
    MAX_LOGPROBS,
    MAX_STOP,
    MAX_STOP_CHARS,
    MAX_STOP_TOKEN_IDS,
    AtMost,
)

Int = Annotated[int, Field(strict=True)]
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Flag = Annotated[bool, Field(strict=True)]
StopText = Annotated[str, Field(strict=True, min_length=1, max_length=MAX_STOP_CHARS)]
GrammarText = Annotated[str, Field(max_length=MAX_GRAMMAR_CHARS)]
TokenId = Annotated[int, Field(strict=True, ge=0)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
Logprobs = Annotated[int, Field(strict=True, ge=0, le=MAX_LOGPROBS)]


class Strict(BaseModel):
    """What every body model shares: validated as JSON reads (strict), never coerced."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False)


class JsonSchemaFormat(Strict):
    name: str | None = None
    schema_: dict[str, Any] | str = Field(alias="schema")
    strict: Flag | None = None
    description: str | None = None


class ResponseFormat(Strict):
    """OpenAI's `response_format` (service/structured.py compiles it)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


def _json_text_bounded(value: dict) -> dict:
    """An object that a grammar compiles from, bounded as its JSON text (what is compiled)."""
    size = len(json.dumps(value))
    if size > MAX_GRAMMAR_CHARS:
        raise PydanticCustomError(
            "too_long", "as JSON text, {size} characters; at most {limit}", {"size": size, "limit": MAX_GRAMMAR_CHARS}
        )
    return value


class StructuredOutputs(Strict):
    """vLLM's `structured_outputs`: exactly one kind (service/structured.py says which is missing).
    What a grammar compiles from is bounded (service/protocol/limits.py), a JSON schema by the body."""

    model_config = ConfigDict(extra="forbid")
    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: GrammarText | None = None
    choice: (
        Annotated[
            list[Annotated[str, Field(strict=True, min_length=1, max_length=MAX_CHOICE_CHARS)]],
            Field(min_length=1, max_length=MAX_CHOICES),
        ]
        | None
    ) = None
    grammar: GrammarText | None = None
    json_object: Flag | None = None
    structural_tag: Annotated[dict[str, Any], AfterValidator(_json_text_bounded)] | GrammarText | None = None
    disable_any_whitespace: Flag | None = None
    whitespace_pattern: str | None = None  # refused: vLLM's xgrammar backend ignores them too
    disable_additional_properties: Flag | None = None


class Sampling(Strict):
    """The sampling fields, per prompt even inside one round."""

    max_tokens: Annotated[Int, Field(ge=1), AtMost("max_new_tokens_limit")] | None = Field(
        None, description="most tokens to generate (default MAX_NEW_TOKENS)"
    )
    temperature: Annotated[Number, Field(ge=0, le=2)] | None = Field(
        None, description="0: greedy (argmax after penalties and logit_bias)"
    )
    top_p: Annotated[Number, Field(gt=0, le=1)] | None = Field(None, description="nucleus sampling")
    top_k: Annotated[Int, Field(ge=-1)] | None = Field(None, description="-1 or 0: every token; k: the k most likely")
    min_p: Annotated[Number, Field(ge=0, le=1)] | None = None
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOP)] | None = Field(
        None, description="end when the text contains one; the text ends before it"
    )
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    min_tokens: Annotated[Int, Field(ge=0)] | None = Field(None, description="at most max_tokens")
    seed: Annotated[Int, Field(ge=-(2**63), le=2**63 - 1)] | None = None
    logprobs: Logprobs | None = Field(None, description="top alternatives per generated token")
    presence_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[Number, Field(ge=-2, le=2)] | None = None
    repetition_penalty: Annotated[Number, Field(gt=0)] | None = None
    logit_bias: (
        Annotated[
            dict[Annotated[str, Field(pattern=r"^[0-9]+$")], Annotated[Number, Field(ge=-100, le=100)]],
            Field(max_length=MAX_LOGIT_BIAS),
        ]
        | None
    ) = Field(None, description="token id (as a string) -> bias added to its score")
    ignore_eos: Flag | None = Field(None, description="generate exactly max_tokens")
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    n: Annotated[Int, Field(ge=1), AtMost("max_n")] | None = Field(None, description="completions per prompt")
    truncate_prompt_tokens: Annotated[Int, Field(ge=-1)] | None = Field(
        None, description="keep the prompt's last k tokens (-1: MAX_INPUT_TOKENS); k >= 1"
    )
    max_queue_ms: Annotated[Number, Field(ge=0)] | None = Field(
        None, description="the most the request will wait for its first token"
    )
    details: Flag | None = Field(None, description="what batching cost each prompt")

    DEFAULT_TEMPERATURE: ClassVar[float] = 0.0  # the demo routes: greedy unless asked
    # the fields that go to SamplingParams as they are, when given
    AS_GIVEN: ClassVar[tuple[str, ...]] = tuple(
        """temperature top_p ignore_eos seed presence_penalty frequency_penalty repetition_penalty top_k min_p
        min_tokens""".split()
    )
    _spec: StructuredSpec | None = PrivateAttr(None)  # the reply's constraint, checked, not compiled

    @model_validator(mode="after")
    def _across_fields(self, info: ValidationInfo):
        self.check_across_fields((info.context or {}).get("config"))
        return self

    def check_across_fields(self, config: Config | None) -> None:
        """`min_tokens` within the token budget, then the constraint (a subclass adds its rules first)."""
        budget = self.token_budget(config)
        if budget is not None and (self.min_tokens or 0) > budget:
            rule = f"in 0..max_tokens ({budget})"
            raise InvalidRequest(f"'min_tokens' must be {rule}, got {self.min_tokens}", param="min_tokens")
        self._spec = self.constraint(config)
        structured.check_free_end(self._spec, self.ignore_eos, self.min_tokens)

    def token_budget(self, config: Config | None) -> int | None:
        """The most tokens to generate: `max_tokens`, else MAX_NEW_TOKENS (None without a config)."""
        if self.max_tokens is not None:
            return self.max_tokens
        return None if config is None else config.max_new_tokens

    def constraint(self, config: Config | None) -> StructuredSpec | None:
        """What the reply is held to: `response_format` or `structured_outputs` (service/structured.py)."""
        return structured.constraint(self.response_format, self.structured_outputs)

    def sampled_logprobs(self) -> int | None:
        """Top alternatives per generated token; None: no logprobs."""
        return self.logprobs

    def to_sampling_params(self, config: Config) -> SamplingParams:
        """What the engines take for each prompt: absent fields at their neutral defaults, the
        temperature at the API's (DEFAULT_TEMPERATURE), the grammar not compiled yet."""
        given = {name: getattr(self, name) for name in self.AS_GIVEN if getattr(self, name) is not None}
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        bias = {int(token): value for token, value in (self.logit_bias or {}).items()}
        return SamplingParams(
            **{"temperature": self.DEFAULT_TEMPERATURE, **given},
            max_tokens=self.token_budget(config),
            logprobs=self.sampled_logprobs(),
            stop=tuple(dict.fromkeys(stops)),
            stop_token_ids=tuple(dict.fromkeys(self.stop_token_ids or ())),
            logit_bias=tuple(sorted(bias.items())),
            structured=self._spec,
        )
