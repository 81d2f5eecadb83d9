"""Fidelity, start time and decode speed of each engine and dtype, in one run: greedy completions
of the chat prompts in bench/prompts.json (through the model's chat template, 24 tokens),
compared token for token with transformers in float32, the reference.

    python -m bench.fidelity            # every configuration, each in its own process

Per configuration: exact matches (the whole completion equals the reference's), the mean
agreeing-prefix fraction (tokens agreeing from the start / the longer completion), whether it
answers "What is the capital of France?" with Paris, seconds to build the engine (vLLM: with the
project's compile cache as it stands), and decode speed (4 and 64 prompts, 20 tokens each).
`python -m bench.fidelity one SPEC.json OUT.json` is the subprocess side.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.measure import _timed, make_prompts

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = json.loads((Path(__file__).resolve().parent / "prompts.json").read_text())
MAX_TOKENS = 24
PARIS_PROMPT = "What is the capital of France?"
# (engine, dtype, eager); the first is the reference. "static" is the service's own Runner, not
# eager: STATIC_COMPILE=1 (its start includes compiling the first graph).
CONFIGS = [
    ("static", "float32", True),
    ("static", "float32", False),
    ("static", "bfloat16", True),
    ("vllm", "bfloat16", False),
    ("vllm", "bfloat16", True),
    ("vllm", "float32", False),
    ("vllm", "float32", True),
]


def chat_texts(model_path: str) -> list[str]:
    """Each prompt as one user turn through the model's chat template, ready for generation."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    return [
        tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in PROMPTS
    ]


def _median_seconds(fn, repeats: int = 3) -> float:
    return statistics.median(_timed(fn, repeats))  # measure's timer: a warm-up, then the runs


def _static(spec: dict) -> dict:
    from batcher.compile_cache import use_compile_cache

    use_compile_cache(spec["compile_cache_dir"], "cpu" if spec["cpu"] else "cuda")  # STATIC_COMPILE's
    from batcher.runner import Runner, set_torch_threads
    from batcher.sequence import SamplingParams, Sequence

    set_torch_threads(0)
    started = time.perf_counter()
    runner = Runner(spec["model_path"], dtype=spec["dtype"], compile=not spec["eager"], max_batch=4)
    compile_s = runner.warm_up() if runner.compiles else 0.0
    start_s = time.perf_counter() - started

    def run(prompts: list[str], max_tokens: int, ignore_eos: bool) -> list[list[int]]:
        out = []
        for i in range(0, len(prompts), 4):  # rounds of BATCH_SIZE 4, as the service runs them
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)
            seqs = [Sequence(p, params) for p in prompts[i : i + 4]]
            runner.generate(seqs, runner.encode([s.prompt for s in seqs]))
            out += [list(s.token_ids) for s in seqs]
        return out

    completions = run(spec["texts"], MAX_TOKENS, False)
    speed = {n: _median_seconds(lambda n=n: run(make_prompts(n), 20, True)) for n in (4,)}
    return {"start_s": start_s, "compile_s": compile_s, "completions": completions, "decode_s": speed}


def _vllm(spec: dict) -> dict:
    from batcher.compile_cache import use_compile_cache

    use_compile_cache(spec["compile_cache_dir"], "cpu" if spec["cpu"] else "cuda")
    from flask import Flask
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    # vLLM's CPU backend hasattr()s every attribute of every imported module, and Flask's
    # context-local proxies (imported with service.config) raise outside a context: give it one
    with Flask(__name__).test_request_context():
        llm = LLM(
            model=spec["model_path"],
            dtype=spec["dtype"],
            enforce_eager=spec["eager"],
            max_model_len=2048,
            max_num_seqs=64,
            gpu_memory_utilization=0.5,
        )
    start_s = time.perf_counter() - started
    greedy = SamplingParams(max_tokens=MAX_TOKENS, temperature=0)
    outs = llm.generate(spec["texts"], greedy, use_tqdm=False)
    completions = [list(o.outputs[0].token_ids) for o in outs]
    # the static path's EOS is not in its token list; drop vLLM's too, for a like-for-like compare
    eos = llm.get_tokenizer().eos_token_id
    completions = [c[:-1] if c and c[-1] == eos else c for c in completions]
    fixed = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    speed = {n: _median_seconds(lambda n=n: llm.generate(make_prompts(n), fixed, use_tqdm=False)) for n in (4, 64)}
    return {"start_s": start_s, "completions": completions, "decode_s": speed, "dtype": spec["dtype"]}


def _agreeing_prefix(a: list[int], b: list[int]) -> float:
    longest = max(len(a), len(b))
    if longest == 0:
        return 1.0
    same = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        same += 1
    return same / longest


def run_config(engine: str, dtype: str, eager: bool | None, texts: list[str], model_path: str, log) -> dict:
    spec = {
        "engine": engine,
        "dtype": dtype,
        "eager": eager,
        "texts": texts,
        "model_path": model_path,
        "compile_cache_dir": os.environ.get("COMPILE_CACHE_DIR", ".cache/compile"),
        "cpu": not _has_gpu(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = Path(tmp, "spec.json"), Path(tmp, "out.json")
        spec_path.write_text(json.dumps(spec))
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
        cmd = [sys.executable, "-m", "bench.fidelity", "one", str(spec_path), str(out_path)]
        subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=1200, check=True)
        return json.loads(out_path.read_text())


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def measure_all(log_path: Path, configs=CONFIGS) -> list[dict]:
    from batcher.checkpoint import resolve_model

    model_path = resolve_model(os.environ.get("MODEL", "smollm2"), os.environ.get("CACHE_DIR", ".cache/models"))
    texts = chat_texts(model_path)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    rows, reference = [], None
    with open(log_path, "a") as log:
        for engine, dtype, eager in configs:
            mode = "eager" if eager else "compiled"
            print(f"fidelity: {engine} {dtype} {mode}", flush=True)
            log.flush()
            result = run_config(engine, dtype, eager, texts, model_path, log)
            reference = reference or result["completions"]
            pairs = list(zip(reference, result["completions"], strict=True))
            paris = tok.decode(result["completions"][PROMPTS.index(PARIS_PROMPT)], skip_special_tokens=True)
            rows.append(
                {
                    "engine": engine,
                    "dtype": dtype,
                    "mode": mode,
                    "exact": sum(a == b for a, b in pairs),
                    "prompts": len(pairs),
                    "prefix": statistics.mean(_agreeing_prefix(a, b) for a, b in pairs),
                    "paris": "Paris" in paris,
                    "paris_text": paris,
                    "start_s": result["start_s"],
                    "compile_s": result.get("compile_s"),
                    "decode_s": result["decode_s"],
                }
            )
            print("  " + table_row(rows[-1]), flush=True)
    return rows


def table_row(r: dict) -> str:
    speed = " | ".join(f"{r['decode_s'][n]:.2f}" if n in r["decode_s"] else "-" for n in ("4", "64"))
    return (
        f"| {r['engine']} | {r['dtype']} | {r['mode']} | {r['exact']}/{r['prompts']} | {r['prefix']:.2f} |"
        f" {'yes' if r['paris'] else 'no: ' + r['paris_text'][:40].replace('|', '/').replace(chr(10), ' ')} |"
        f" {r['start_s']:.1f} | {speed} |"
    )


def table(rows: list[dict]) -> list[str]:
    head = [
        "| engine | dtype | decoding | exact (vs static fp32 eager) | agreeing prefix | France -> Paris | start (s)"
        " | 4 prompts (s) | 64 prompts (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    # json round-trips the decode dict's int keys as strings
    rows = [{**r, "decode_s": {str(k): v for k, v in r["decode_s"].items()}} for r in rows]
    return head + [table_row(r) for r in rows] + static_compile_line(rows)


def static_compile_line(rows: list[dict]) -> list[str]:
    """STATIC_COMPILE=1 against 0, measured side by side in this run: a round of 4, 20 tokens."""
    by = {(r["engine"], r["dtype"], r["mode"]): r for r in rows}
    eager, fast = by.get(("static", "float32", "eager")), by.get(("static", "float32", "compiled"))
    if not (eager and fast):
        return []
    speedup = eager["decode_s"]["4"] / fast["decode_s"]["4"]
    return [
        "",
        f"STATIC_COMPILE=1 vs 0, a round of 4 (20 tokens), fp32: {eager['decode_s']['4']:.2f} s eager,"
        f" {fast['decode_s']['4']:.2f} s compiled: {speedup:.2f}x (target 1.25x); first graph compiled"
        f" in {fast['compile_s']:.0f} s",
    ]


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m bench.fidelity", description=__doc__.split("\n\n")[0])
    p.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "bench-fidelity.log")
    p.add_argument(
        "--configs",
        help="a subset, e.g. static:float32:compiled,vllm:float32:eager (the reference, static:float32:eager,"
        " always runs first)",
    )
    args = p.parse_args(argv)
    configs = CONFIGS
    if args.configs:
        modes = {"eager": True, "compiled": False, "": True}
        picked = [tuple(c.split(":") + [""])[:3] for c in args.configs.split(",")]
        configs = [CONFIGS[0]] + [(e, d, modes[m]) for e, d, m in picked if (e, d, modes[m]) != CONFIGS[0]]
    rows = measure_all(args.log, configs)
    print("\n".join(table(rows)))
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["one"]:
        spec = json.loads(Path(sys.argv[2]).read_text())
        result = {"static": _static, "vllm": _vllm}[spec["engine"]](spec)
        Path(sys.argv[3]).write_text(json.dumps(result))
    else:
        main()
