"""Structured outputs' cost: a `json_schema` constraint against none per generated token, on a static
round of 4 (/generate) and 16 concurrent prompts on vLLM (/generate_vllm), at equal work: each free
row generates exactly as many tokens as its constrained twin (`ignore_eos`, that many `max_tokens`:
one request per row). The static four queue behind a running request, to share one round, timed
by the round (`inference_ms`); vLLM's by the wave's wall time. And the schema's compile cost."""

import contextlib
import json
import statistics
import time
from pathlib import Path

from batcher import grammar
from bench import measure
from service.config import Config
from service.tools.spec import Tools, reply_schema

# an order schema with an enum, a nested object, a bounded array and integers; orders to fill it from
DATA = json.loads((Path(__file__).resolve().parent / "structured.json").read_text())
SCHEMA, ORDERS = DATA["schema"], DATA["orders"]
CONSTRAINED = {"max_tokens": 96, "structured_outputs": {"json": SCHEMA}}
# a tool call: the grammar service/tools/spec.py constrains a named get_weather call to
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}}
CALL = {"name": "get_weather", "parameters": {**WEATHER, "required": ["city", "unit"]}}
TOOL_SCHEMA = reply_schema(Tools({"get_weather": CALL}, "named", "get_weather"))
TOOL_CALL = {"max_tokens": 96, "structured_outputs": {"json": TOOL_SCHEMA}}
CITIES = ["Paris", "Cairo", "Tokyo", "Lima"]
KINDS = {  # (the constraint, the i-th prompt)
    "json_schema": (CONSTRAINED, lambda i: f"The order as JSON: {ORDERS[i % len(ORDERS)]} (#{i})"),
    "tool_call": (TOOL_CALL, lambda i: f"Call get_weather for the weather in {CITIES[i % len(CITIES)]} (#{i}):"),
}
PROMPTS = {"static": 4, "vllm": 16}


def _timed(srv, engine: str, bodies: list[dict]) -> tuple[float, list[int]]:
    """Seconds of the work, and the tokens each row generated."""
    behind = measure.while_running(srv, engine, ["Count from one to twenty."], 16) if engine == "static" else None
    with behind or contextlib.nullcontext():
        run = measure.wave(srv.url, measure.PATHS[engine], bodies)
    if engine == "static" and run.rounds != 1:
        raise RuntimeError(f"{len(bodies)} static prompts ran in {run.rounds} rounds, not one: the machine is too busy")
    seconds = max(d["inference_ms"] for d in run.details) / 1000 if engine == "static" else run.seconds
    return seconds, [d["tokens"] for d in run.details]


def cost(srv, engine: str, repeats: int, kind: str = "json_schema") -> dict:
    """One table row: seconds and milliseconds per token each way (medians), and their ratio;
    `kind`: the constraint, a json_schema or a tool call (KINDS)."""
    constrained, prompt = KINDS[kind]
    prompts = [prompt(i) for i in range(PROMPTS[engine])]
    measure.post(srv.url, measure.PATHS[engine], {"prompts": prompts[:1], **constrained, "max_tokens": 4})  # warm
    runs = []  # per repeat: (json_schema seconds, none seconds, tokens)
    for _ in range(repeats):
        seconds, tokens = _timed(srv, engine, [{"prompts": [p], **constrained} for p in prompts])
        free = [{"prompts": [p], "max_tokens": n, "ignore_eos": True} for p, n in zip(prompts, tokens, strict=True)]
        free_s, free_tokens = _timed(srv, engine, free)
        if free_tokens != tokens:
            raise RuntimeError(f"{engine}: the free twins generated {free_tokens} tokens, not {tokens}")
        runs.append((seconds, free_s, sum(tokens)))
    row = {"engine": engine, "prompts": len(prompts), "tokens": sum(tokens)}
    for way, at in ((kind, 0), ("none", 1)):
        row[f"{way} (s)"] = round(statistics.median(run[at] for run in runs), 2)
        row[f"{way} (ms/token)"] = round(statistics.median(1000 * run[at] / run[2] for run in runs), 1)
    row[f"{kind}/none per token"] = round(row[f"{kind} (ms/token)"] / row["none (ms/token)"], 3)
    print(f"  {row}", flush=True)
    return row


def compile_cost(model_path: str) -> dict:
    """The schema compiled by batcher.grammar in this process: the compiler (xgrammar's import and
    the tokenizer's info, once per process), the first compile and a cached one (median of 20)."""
    cap = Config().grammar_cache_mb << 20  # the service's default cap (GRAMMAR_CACHE_MB)
    started = time.perf_counter()
    grammar.compiler(model_path, cap)
    spec = grammar.StructuredSpec("json", json.dumps(SCHEMA))
    row = {"compiler, once per process (s)": round(time.perf_counter() - started, 2)}
    row["first compile (ms)"] = round(grammar.compile(spec, model_path, cap).compile_ms, 1)
    row["cached (ms)"] = round(
        statistics.median(grammar.compile(spec, model_path, cap).compile_ms for _ in range(20)), 4
    )
    return row
