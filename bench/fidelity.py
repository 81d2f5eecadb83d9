"""Fidelity (`python -m bench.fidelity`, each configuration in its own process): greedy completions
of bench/prompts.json through the chat template (24 tokens) against transformers in fp32: exact
matches, mean agreeing-prefix fraction (tokens agreeing from the start / the longer completion),
"What is the capital of France?" -> Paris, engine build seconds (vLLM: with the project's compile
cache as it stands), and decode seconds (4 and 64 prompts, 20 tokens)."""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from bench import inproc
from bench.measure import make_prompts

PROMPTS = json.loads((Path(__file__).resolve().parent / "prompts.json").read_text())
MAX_TOKENS = 24
PARIS_PROMPT = "What is the capital of France?"
# (engine, dtype, eager); the first is the reference. "static" is the service's own Runner
# (compiled: STATIC_COMPILE=1, its start includes compiling the first graph).
CONFIGS = [("static", "float32", True), ("static", "float32", False), ("static", "bfloat16", True)]
CONFIGS += [("vllm", dtype, eager) for dtype in ("bfloat16", "float32") for eager in (False, True)]
SPEED_N = {"static": (4,), "vllm": (4, 64)}  # prompts per timed call, 20 tokens, median of 3
HEADER = "| engine | dtype | decoding | exact (vs static fp32 eager) | agreeing prefix | France -> Paris | start (s)"
HEADER += " | 4 prompts (s) | 64 prompts (s) |"


def _agreeing_prefix(a: list[int], b: list[int]) -> float:
    same = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return same / max(len(a), len(b)) if a or b else 1.0


def measure_all(log_path: Path, configs=CONFIGS) -> list[dict]:
    from transformers import AutoTokenizer

    from batcher.checkpoint import resolve_model
    from service.config import Config

    config = Config.from_env()
    tok = AutoTokenizer.from_pretrained(resolve_model(config.model, config.cache_dir))
    chat = [[{"role": "user", "content": p}] for p in PROMPTS]
    texts = [tok.apply_chat_template(turn, tokenize=False, add_generation_prompt=True) for turn in chat]
    rows, reference = [], None
    with open(log_path, "a") as log:
        for engine, dtype, eager in configs:
            mode = "eager" if eager else "compiled"
            print(f"fidelity: {engine} {dtype} {mode}", flush=True)
            timed = [make_prompts(n) for n in SPEED_N[engine]]
            spec = dict(engine=engine, dtype=dtype, eager=eager, texts=texts, max_tokens=MAX_TOKENS, timed=timed)
            result = inproc.run({**spec, "timed_tokens": 20, "repeats": 3, "round": 4}, log)
            reference = reference or result["completions"]
            pairs = list(zip(reference, result["completions"], strict=True))
            paris = tok.decode(result["completions"][PROMPTS.index(PARIS_PROMPT)], skip_special_tokens=True)
            speed = {str(n): statistics.median(runs) for n, runs in zip(SPEED_N[engine], result["runs"], strict=True)}
            rows.append(
                dict(engine=engine, dtype=dtype, mode=mode, exact=sum(a == b for a, b in pairs), prompts=len(pairs),
                     prefix=statistics.mean(_agreeing_prefix(a, b) for a, b in pairs), paris="Paris" in paris,
                     paris_text=paris, start_s=result["start_s"], compile_s=result.get("compile_s"), decode_s=speed)
            )  # fmt: skip
            print("  " + table_row(rows[-1]), flush=True)
    return rows


def table_row(r: dict) -> str:
    speed = " | ".join(f"{r['decode_s'][n]:.2f}" if n in r["decode_s"] else "-" for n in ("4", "64"))
    wrong = "no: " + r["paris_text"][:40].replace("|", "/").replace("\n", " ")
    return (
        f"| {r['engine']} | {r['dtype']} | {r['mode']} | {r['exact']}/{r['prompts']} | {r['prefix']:.2f} |"
        f" {'yes' if r['paris'] else wrong} | {r['start_s']:.1f} | {speed} |"
    )


def table(rows: list[dict]) -> list[str]:
    """The fidelity table, and STATIC_COMPILE=1 against 0 measured side by side in this run."""
    lines = [HEADER, "|---" * 9 + "|", *map(table_row, rows)]
    by = {(r["engine"], r["dtype"], r["mode"]): r for r in rows}
    eager, fast = by.get(("static", "float32", "eager")), by.get(("static", "float32", "compiled"))
    if eager and fast:
        e, f = eager["decode_s"]["4"], fast["decode_s"]["4"]
        lines += ["", f"STATIC_COMPILE=1 vs 0, a round of 4 (20 tokens), fp32: {e:.2f} s eager, {f:.2f} s compiled:"
                  f" {e / f:.2f}x (target 1.25x); first graph compiled in {fast['compile_s']:.0f} s"]  # fmt: skip
    return lines


if __name__ == "__main__":
    print("\n".join(table(measure_all(Path(tempfile.gettempdir()) / "bench-fidelity.log"))))
