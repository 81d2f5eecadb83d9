"""The bounds of a body, each a 400 naming its field (422 on the demo routes) before anything
that grows with it runs: the constants below, declared on the fields as pydantic's `max_length`
(/openapi.json's maxItems and maxLength), and the ones that are settings (MAX_NEW_TOKENS_LIMIT,
MAX_N, ...), declared as `AtMost("max_n")`, checked against the app's `Config` (the validation
context), and shown in /openapi.json as that setting's value (service/ops/openapi.py).

Besides these, every body is at most MAX_BODY_BYTES (1 MiB) and MAX_JSON_DEPTH deep."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler, ValidationInfo
from pydantic_core import PydanticCustomError, core_schema

from service.errors import TooManyPrompts

# OpenAI's limits, which clients already respect
MAX_STOP = 4  # stop strings per request
MAX_LOGPROBS = 5  # top alternatives per token (completions)
MAX_LOGIT_BIAS = 300  # entries
MAX_TOOLS = 128  # tools per request: each is rendered into the prompt and into the reply's grammar
# ours
MAX_STOP_TOKEN_IDS = 64
# A stop string is matched against the completion's tail at every step, and a stream holds back
# up to its length: no use we know of needs one longer, and vLLM sets no bound at all.
MAX_STOP_CHARS = 1024
# Messages (chat, /tokenize) or `input` items (Responses): the chat template renders each one
# before the context check can run. Even empty, one renders to 6 tokens on SmolLM2's template
# (its role markers), so 1,024 are 6,000 tokens or more, 12x the longest prompt the default
# context runs (MAX_INPUT_TOKENS, 512): room for a long conversation cut by `truncate_prompt_tokens`.
MAX_MESSAGES = 1024
# What a grammar compiles from (`regex`, `grammar`, `structural_tag` as JSON text, and the choices
# of `choice` together): a compile's time and its room in xgrammar's cache grow with it (figures:
# docs/operations.md#limits-per-request). A JSON schema is bounded by the body alone.
MAX_GRAMMAR_CHARS = 64 * 1024
MAX_CHOICES = 256  # 256 choices of at most MAX_CHOICE_CHARS: MAX_GRAMMAR_CHARS in all
MAX_CHOICE_CHARS = 256

MARK = "x-at-most"  # the JSON schema keyword that names the setting, until the document fills it in


@dataclass(frozen=True)
class AtMost:
    """`setting`: the Config field that bounds the value (a list: its length). `too_many`: the
    413 `too_many_prompts` instead of a 400/422, for the prompt count (docs/api.md, Errors)."""

    setting: str
    too_many: bool = False

    def __get_pydantic_core_schema__(self, source, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.with_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(self, schema, handler: GetJsonSchemaHandler) -> dict:
        out = handler(schema)
        out[MARK] = self.setting
        return out

    def _check(self, value, info: ValidationInfo):
        config = (info.context or {}).get("config")
        if value is None or config is None:
            return value
        limit = getattr(config, self.setting)
        size = len(value) if isinstance(value, (list, tuple)) else value
        if size <= limit:
            return value
        if self.too_many:  # not a ValueError: pydantic lets it through as it is
            raise TooManyPrompts(f"{size} prompts; at most {limit} per request", param=info.field_name)
        raise PydanticCustomError(
            "at_most", "must be at most {limit} ({setting})", {"limit": limit, "setting": self.setting.upper()}
        )


def fill(schema, config) -> None:
    """Replace every MARK in a JSON schema (in place) by the setting's value: `maximum` for a
    number, `maxItems` for an array."""
    if isinstance(schema, list):
        for item in schema:
            fill(item, config)
    elif isinstance(schema, dict):
        setting = schema.pop(MARK, None)
        if setting is not None:
            limit = getattr(config, setting)
            schema["maxItems" if schema.get("type") == "array" else "maximum"] = limit
        for value in schema.values():
            fill(value, config)
