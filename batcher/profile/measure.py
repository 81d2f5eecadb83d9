"""Measure this machine's candidates, each in its own process, within a time budget.

Per engine, every dtype the engine takes on this device (fp32, fp16, bf16), eager and compiled
(STATIC_COMPILE for the static engine, VLLM_ENFORCE_EAGER for vLLM). Each: the greedy chat
completions of prompts.json (24 tokens) against the static engine's fp32 eager (the reference,
measured first), France -> Paris, its start (and compile) seconds, and the seconds of one call
of 1, 4 (and, vLLM only, 64: sixteen static rounds cost too much here) prompts of 20 tokens,
after a warm-up. Eager rows of every dtype first (cheap), then compiled ones, and a compiled
row only for a dtype whose eager row was faithful (compiling never answered closer to fp32 in
our tables). A candidate that overruns what is left of the budget is recorded as timed out.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

from batcher.profile import child, choose, store
from batcher.settings import StaticSettings, VLLMSettings

PROMPTS = json.loads(Path(__file__).with_name("prompts.json").read_text())
PARIS_PROMPT = "What is the capital of France?"
DTYPES = ("float32", "float16", "bfloat16")
SIZES = {"static": (1, 4), "vllm": (1, 4, 64)}
MAX_TOKENS, TIMED_TOKENS, BUDGET_S = 24, 20, 240.0
# Quantized routes (issue 18) and the CPU flags their kernels need; absent here: not built.
QUANTIZED = {"4-bit CPUWNA16 (vLLM)": ("avx512f",), "int8 W8A8 (vLLM)": ("avx512_vnni", "avx_vnni")}


def templates(model_path: str) -> tuple[StaticSettings, VLLMSettings]:
    """The service's default settings on a CPU (tests/test_profile.py checks them against
    Config's), so that what the profile compiles is what `make serve` finds in the cache."""
    static = StaticSettings(model_path, "cpu", "float32", False, "", 4, 0.0, 256, 512, 512, 0)
    return static, VLLMSettings(model_path, True, "cpu", "float32", True, "", 64, 2048, 512, 1, 0.5, 256, 1)


def candidates() -> list[tuple[str, str, bool]]:
    """(engine, dtype, eager) in the order they are measured; the first is the reference."""
    eager = [(engine, dtype, True) for dtype in DTYPES for engine in ("static", "vllm")]
    return eager + [(engine, dtype, False) for engine, dtype, _ in eager]


def quantized_notes(flags: list[str]) -> list[str]:
    return [
        f"{route}: not measured, this CPU lacks {' / '.join(needs)}"
        for route, needs in QUANTIZED.items()
        if not set(needs) & set(flags)
    ]


def chat_texts(tok) -> list[str]:
    chat = [[{"role": "user", "content": p}] for p in PROMPTS]
    return [tok.apply_chat_template(turn, tokenize=False, add_generation_prompt=True) for turn in chat]


def speed_prompts(n: int) -> list[str]:
    """n distinct prompts (vLLM's prefix cache would make repeats cheap)."""
    return [PROMPTS[i % len(PROMPTS)] + (f" ({i})" if i >= len(PROMPTS) else "") for i in range(n)]


def _agreeing_prefix(a: list[int], b: list[int]) -> float:
    same = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return same / max(len(a), len(b)) if a or b else 1.0


def compare(reference: list[list[int]], completions: list[list[int]], paris: str) -> dict:
    """Exact matches, the mean agreeing-prefix fraction (tokens agreeing from the start / the
    longer), France -> Paris (`paris`: the decoded answer to PARIS_PROMPT)."""
    pairs = list(zip(reference, completions, strict=True))
    return {
        "exact": sum(a == b for a, b in pairs),
        "of": len(pairs),
        "prefix": round(statistics.mean(_agreeing_prefix(a, b) for a, b in pairs), 3),
        "france": "Paris" in paris,
        "france_text": paris[:40].replace("\n", " "),
    }


def measure_one(engine: str, dtype: str, eager: bool, base, texts: list[str], log, timeout: float, **how) -> dict:
    """One candidate in its own process: its row without the comparison, plus its completions."""
    row = {"engine": engine, "dtype": dtype, "eager": eager}
    fast = {"compile": not eager} if engine == "static" else {"enforce_eager": eager}
    settings = dataclasses.replace(base, dtype=dtype, reason="profile candidate", **fast)
    sizes = how.get("sizes", SIZES)[engine]
    spec = dict(engine=engine, settings=dataclasses.asdict(settings), compile_cache_dir=how.get("cache", ""))
    spec.update(texts=texts, max_tokens=MAX_TOKENS, timed_tokens=TIMED_TOKENS, repeats=how.get("repeats", 1))
    started = time.monotonic()
    try:
        out = child.run({**spec, "timed": [speed_prompts(n) for n in sizes]}, log, timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        return {**row, "status": f"timed out after {timeout:.0f} s", "seconds": round(time.monotonic() - started)}
    except subprocess.CalledProcessError as exc:
        return {**row, "status": f"failed: exit {exc.returncode}", "seconds": round(time.monotonic() - started)}
    row.update(status="measured", start_s=round(out["start_s"], 1), compile_s=out.get("compile_s"))
    row["speed"] = {str(n): round(statistics.median(runs), 3) for n, runs in zip(sizes, out["runs"], strict=True)}
    return {**row, "seconds": round(time.monotonic() - started), "completions": out["completions"]}


def measure(model_path: str, log_path: Path, budget_s: float = BUDGET_S, only=None, base=None, **how) -> dict:
    """The profile: every candidate (or those in `only`) within `budget_s` seconds in all.
    `base`: (StaticSettings, VLLMSettings) to vary (default: `templates`); `how`: `cache` (the
    compile cache folder), `repeats`, `sizes`."""
    started, key = time.monotonic(), store.machine_key(model_path)
    base = base or templates(model_path)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    texts, rows, reference, unfaithful = chat_texts(tokenizer), [], None, {}
    with open(log_path, "a") as log:
        for engine, dtype, eager in [c for c in candidates() if only is None or c in only or c == candidates()[0]]:
            left = budget_s - (time.monotonic() - started)
            row = {"engine": engine, "dtype": dtype, "eager": eager}
            if reference is None and rows:
                rows.append({**row, "status": "not run: no reference"})
            elif not eager and (engine, dtype) in unfaithful:
                rows.append({**row, "status": f"not run: {dtype} eager {unfaithful[engine, dtype]}"})
            elif left < 1:
                rows.append({**row, "status": "timed out: budget spent before it started"})
            else:
                row = measure_one(engine, dtype, eager, base[engine == "vllm"], texts, log, left, **how)
                completions = row.pop("completions", None)
                if completions is not None:
                    reference = reference or completions
                    paris = tokenizer.decode(completions[PROMPTS.index(PARIS_PROMPT)], skip_special_tokens=True)
                    row.update(compare(reference, completions, paris))
                rows.append(row)
                if eager and not choose.faithful(row):
                    unfaithful[engine, dtype] = "was not faithful" if completions else row["status"]
            print(f"  {rows[-1]}", flush=True)
    first = rows[0]
    return {
        "key": key,
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "budget_s": budget_s,
        "wall_s": round(time.monotonic() - started),
        "reference": "measured" if first.get("status") == "measured" else first.get("status"),
        "notes": quantized_notes(key["cpu"].get("flags", [])),
        "rows": rows,
    }
