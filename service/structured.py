"""Structured outputs of a request body, parsed, validated and compiled once for every route.

Two spellings, vLLM 0.32's names and meanings (its OpenAI protocol maps `response_format` onto
`structured_outputs` the same way):
- OpenAI's `response_format`: {"type": "text"} (no constraint), {"type": "json_object"},
  {"type": "json_schema", "json_schema": {"name", "schema", "strict"?}};
- vLLM's `structured_outputs`: exactly one of `json` (a JSON schema, object or text), `regex`,
  `choice` (a list of strings), `grammar` (EBNF or Lark), `json_object: true`, `structural_tag`
  (xgrammar's structural tag, object or text); `disable_any_whitespace: true` is accepted and
  is what both engines always do (compact JSON, see batcher/grammar.py).
The demo routes take either, for every prompt of the request.

Two steps, both in the request thread, so that the model thread never compiles:
- `constraint`, as the request's model is validated (service/protocol/sampling.py): what is
  cheap to check (the shape, a JSON schema against its metaschema, the keywords xgrammar does
  not enforce); the spec stays uncompiled;
- `compile_params`, from service/generation.py once the request has passed the context-length
  check and the engine's admission would take it: compiling costs CPU and a place in xgrammar's
  cache, which a request refused with a 400, 429 or 503 must not take (docs/operations.md,
  limits per request).
A bad spec raises `InvalidRequest` naming its field (OpenAI routes: 400 with `param`).
"""

from __future__ import annotations

import dataclasses
import json

import jsonschema

from batcher import grammar
from batcher.checkpoint import resolve_model
from batcher.grammar import StructuredSpec
from batcher.sampling import SamplingParams
from service.config import Config
from service.errors import InvalidRequest

RESPONSE_FORMATS = ("text", "json_object", "json_schema")
# what GET /v1/models announces, per request field
SUPPORTED = {"response_format": list(RESPONSE_FORMATS), "structured_outputs": list(grammar.KINDS)}
# vLLM's per-request options that its xgrammar backend ignores (they are engine settings there)
UNSUPPORTED_OPTIONS = ("whitespace_pattern", "disable_additional_properties")


def constraint(response_format, structured_outputs) -> StructuredSpec | None:
    """The constraint that a body's `response_format` or `structured_outputs` asks for (their
    models in service/protocol/sampling.py), checked but not compiled (`compile_params` compiles
    it), or None."""
    spec = _response_format(response_format) if response_format is not None else None
    if structured_outputs is None:
        return spec
    if spec is not None:
        raise InvalidRequest(
            "'response_format' and 'structured_outputs' both constrain the output: send one", param="response_format"
        )
    return _structured_outputs(structured_outputs)


def check_free_end(spec: StructuredSpec | None, ignore_eos: bool | None, min_tokens: int | None) -> None:
    """A complete grammar allows only EOS: it cannot go with `ignore_eos` or `min_tokens`."""
    if spec is not None and (ignore_eos or min_tokens):
        raise InvalidRequest(
            f"'{spec.param}' ends the text where its grammar does: not with 'ignore_eos' or 'min_tokens'",
            param=spec.param,
        )


def compiler(config: Config):
    """The process's xgrammar compiler for the served model, its cache capped at GRAMMAR_CACHE_MB."""
    return grammar.compiler(resolve_model(config.model, config.cache_dir), cache_limit_bytes(config))


def cache_limit_bytes(config: Config) -> int:
    return config.grammar_cache_mb * 1024 * 1024


def compile_params(params: SamplingParams, config: Config) -> SamplingParams:
    """`params` with its spec compiled (as they are without one, or with one compiled already); a
    spec that does not compile is a 400 naming its field, on both engines (vLLM compiles it again
    with its own backend: the same grammar, refused the same way)."""
    spec = params.structured
    if spec is None or spec.compiled is not None:
        return params
    try:
        compiled = grammar.compile(spec, resolve_model(config.model, config.cache_dir), cache_limit_bytes(config))
    except grammar.GrammarError as exc:
        what = "the functions' parameters do" if spec.param == "tools" else f"the {spec.kind} does"
        raise InvalidRequest(f"'{spec.param}': {what} not compile: {exc}", param=spec.param) from exc
    return dataclasses.replace(params, structured=compiled)


def _response_format(fmt) -> StructuredSpec | None:
    """`fmt`: a ResponseFormat (service/protocol/sampling.py)."""
    if fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return StructuredSpec("json_object", param="response_format")
    if fmt.json_schema is None:
        rule = "needs 'json_schema': {'name', 'schema', 'strict'?}"
        raise InvalidRequest(f"'response_format' of type 'json_schema' {rule}", param="response_format")
    schema = schema_text(fmt.json_schema.schema_, "response_format")
    return StructuredSpec("json", schema, param="response_format")


def _structured_outputs(model) -> StructuredSpec:
    """`model`: a StructuredOutputs (service/protocol/sampling.py), its fields' types checked."""
    outputs = {"json" if name == "json_" else name: getattr(model, name) for name in type(model).model_fields}

    def bad(why: str) -> InvalidRequest:
        return InvalidRequest(f"'structured_outputs' {why}", param="structured_outputs")

    for option in UNSUPPORTED_OPTIONS:
        if outputs.get(option) is not None:
            raise bad(f"'{option}' is not supported (vLLM's xgrammar backend ignores it too)")
    if outputs.get("disable_any_whitespace") is False:
        raise bad("'disable_any_whitespace' can only be true: JSON output is always compact on both engines")
    kinds = [kind for kind in grammar.KINDS if outputs.get(kind) is not None]
    if len(kinds) != 1:
        raise bad(f"needs exactly one of {', '.join(grammar.KINDS)}, got {len(kinds)}: {', '.join(kinds) or 'none'}")
    [kind] = kinds
    value, field = outputs[kind], "structured_outputs"
    if kind == "json":
        return StructuredSpec("json", schema_text(value, field), param=field)
    if kind == "json_object":
        if value is not True:
            raise bad("'json_object' must be true")
        return StructuredSpec("json_object", param=field)
    if kind == "choice":
        return StructuredSpec("choice", tuple(dict.fromkeys(value)), param=field)
    if kind == "structural_tag":
        return StructuredSpec("structural_tag", json.dumps(value) if isinstance(value, dict) else value, param=field)
    if not value.strip():  # regex, grammar
        raise bad(f"'{kind}' must be a non-empty string")
    return StructuredSpec(kind, value, param=field)


def schema_text(schema, field: str) -> str:
    """A JSON schema (an object, or its JSON text) checked against its own metaschema, as text."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"'{field}': the schema is not valid JSON: {exc}", param=field) from exc
    if not isinstance(schema, dict):
        raise InvalidRequest(f"'{field}': the schema must be a JSON object", param=field)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise InvalidRequest(f"'{field}': not a valid JSON Schema: {exc.message}", param=field) from exc
    # xgrammar compiles some keywords without enforcing them (multipleOf, uniqueItems, contains,
    # some string formats, ...): vLLM refuses such a schema, and the static engine would drop
    # them silently. vLLM's own rule, so both engines refuse the same schemas (imported here, not
    # at the top: vLLM is loaded by its engine thread, or on the first schema when it is off).
    from vllm.v1.structured_output.backend_xgrammar import has_xgrammar_unsupported_json_features

    if has_xgrammar_unsupported_json_features(schema):
        raise InvalidRequest(
            f"'{field}': the schema uses keywords that xgrammar does not enforce (multipleOf, uniqueItems,"
            " contains, unsupported string formats, ...): refused on both engines, as vLLM refuses them",
            param=field,
        )
    return json.dumps(schema)
