"""Structured outputs: what a request constrains its text to (`StructuredSpec`), compiled once in
the request thread with xgrammar, the library vLLM's own default backend uses, so that a spec
means the same grammar on both engines. The compiler's cache of compiled grammars is capped in
bytes by the caller (the service's GRAMMAR_CACHE_MB, vLLM's 512 MB): uncapped, every distinct
schema stayed for the life of the process (docs/operations.md#limits-per-request).

The static engine masks each constrained row with the compiled grammar (batcher/static/constraint.py);
the vLLM engine gets the spec as `StructuredOutputsParams` (`vllm_params`) and compiles it with
its own xgrammar backend, set up by `vllm_config()` the way `compile()` compiles here.

JSON is compact on both engines (no free whitespace between tokens): with xgrammar's default
`any_whitespace`, a 135M model under a JSON grammar can emit whitespace until max_tokens (a
trial of vLLM's own server with those defaults parsed 7 of 10 SDK `parse()` replies on a bounded
schema); without it, whitespace is no way to loop, and a schema whose strings and arrays are
bounded always closes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
import time
from dataclasses import dataclass, field

KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")
COMPACT = (",", ":")  # JSON separators without whitespace (vLLM's disable_any_whitespace)


@dataclass(frozen=True)
class StructuredSpec:
    """One constraint: `kind` (one of KINDS) and its `value`: the JSON schema as JSON text, the
    regex, the choices (a tuple), the EBNF or Lark grammar, or the structural tag as JSON text
    (json_object: ""). `param`: the request field it came from, which a refusal names (the
    engines never read it). `compiled`: the grammar compiled for this process's model, set by
    `compile()`, the last step before the spec is enqueued; neither is part of its identity."""

    kind: str
    value: str | tuple[str, ...] = ""
    param: str = field(default="", compare=False)
    compiled: object = field(default=None, compare=False, repr=False)
    compile_ms: float | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"structured output kind must be one of {', '.join(KINDS)}, got {self.kind!r}")


class GrammarError(ValueError):
    """A spec that xgrammar cannot compile: the message says why."""


_compiler_lock = threading.Lock()


def compiler(model_path: str, cache_limit_bytes: int):
    """The xgrammar compiler of one model's tokenizer: its TokenizerInfo is built once per process
    (it reads the whole vocabulary); compiled grammars are kept in the compiler's own cache, keyed
    by what was compiled, so the same spec compiles once, and the least recently used leave it
    once it holds `cache_limit_bytes` (xgrammar's own count, which it may pass a little). Under a
    lock: `functools.cache` alone lets every request that arrives before the first build ends
    build its own, so a burst at a fresh server built it once per request
    (docs/operations.md#limits-per-request)."""
    if cache_limit_bytes < 1:  # xgrammar reads -1 as no limit at all: the leak this cap ends
        raise ValueError(f"the grammar cache limit must be >= 1 byte, got {cache_limit_bytes}")
    with _compiler_lock:
        return _compiler(model_path, cache_limit_bytes)


@functools.cache
def _compiler(model_path: str, cache_limit_bytes: int):
    import xgrammar as xgr

    return xgr.GrammarCompiler(_tokenizer_info(model_path), cache_limit_bytes=cache_limit_bytes)


@functools.cache
def _tokenizer_info(model_path: str):
    import xgrammar as xgr
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    # the model's logits width, as vLLM passes it: the bitmask must cover every logit
    vocab_size = AutoConfig.from_pretrained(model_path).vocab_size
    return xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)


def is_lark(grammar: str) -> bool:
    """vLLM's rule (`grammar_is_likely_lark`, not imported: importing vLLM in a request thread
    would set it up before its engine thread does): a grammar with a `::=` rule is EBNF."""
    for line in grammar.split("\n"):
        line = line.split("#")[0].split("//")[0].strip()
        if "::=" in line:
            return False
    return True


def choice_grammar(choices: tuple[str, ...]) -> str:
    """The choices as one EBNF alternation, each a literal (vLLM's `choice_as_grammar`)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def compile(spec: StructuredSpec, model_path: str, cache_limit_bytes: int) -> StructuredSpec:
    """The spec with its grammar compiled (raises GrammarError); a cache hit is microseconds.
    `cache_limit_bytes`: the compiler's cache cap (`compiler()`)."""
    xgr_compiler = compiler(model_path, cache_limit_bytes)
    started = time.perf_counter()
    try:
        if spec.kind == "json":
            compiled = xgr_compiler.compile_json_schema(spec.value, any_whitespace=False, separators=COMPACT)
        elif spec.kind == "json_object":
            compiled = xgr_compiler.compile_json_schema('{"type": "object"}', any_whitespace=False, separators=COMPACT)
        elif spec.kind == "regex":
            compiled = xgr_compiler.compile_regex(spec.value)
        elif spec.kind == "choice":
            compiled = xgr_compiler.compile_grammar(choice_grammar(spec.value))
        elif spec.kind == "grammar":
            grammar = spec.value
            compiled = xgr_compiler.compile_lark(grammar) if is_lark(grammar) else xgr_compiler.compile_grammar(grammar)
        else:  # structural_tag
            compiled = xgr_compiler.compile_structural_tag(spec.value)
    except (RuntimeError, ValueError, TypeError) as exc:  # xgrammar's parsers raise RuntimeError
        raise GrammarError(_first_line(exc)) from exc
    if not _allows_a_token(compiled):
        raise GrammarError("it allows no text at all: no token can start it")
    elapsed = (time.perf_counter() - started) * 1000
    return dataclasses.replace(spec, compiled=compiled, compile_ms=elapsed)


def _allows_a_token(compiled) -> bool:
    """Whether a fresh matcher takes some first token (EOS counts, where the grammar may end at
    once). One that takes none, such as the JSON schema `{"$ref": "#"}` (it only refers to
    itself), would leave its row nothing to sample: the static round's sampler fails on it and
    vLLM ends the request with finish_reason "error". Refused at compile time instead: a 400."""
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(1, compiled.tokenizer_info.vocab_size)
    xgr.GrammarMatcher(compiled).fill_next_token_bitmask(bitmask)
    return bool((bitmask != 0).any())


def _first_line(exc: BaseException) -> str:
    """xgrammar's message without its C++ source location prefix."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split(": ", 1)[1] if text.startswith("[") and ": " in text else text


def vllm_config():
    """The vLLM engine's structured-output settings (engine-wide in 0.32: its xgrammar backend
    reads no per-request whitespace option): xgrammar, compact JSON, as `compile()` does."""
    from vllm.config import StructuredOutputsConfig

    return StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True)


def vllm_params(spec: StructuredSpec | None):
    """vLLM's `StructuredOutputsParams` for the spec (None: unconstrained)."""
    if spec is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    if spec.kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    value = list(spec.value) if spec.kind == "choice" else spec.value
    return StructuredOutputsParams(**{spec.kind: value})
