"""Timed calls: HTTP against the service, and the in-process baselines run in a subprocess.

`python -m bench.measure direct|offline SPEC_JSON OUT.json` is the subprocess side: it loads the
model the way the service does (the service's own `Config.from_env()`) and times the bare call.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import requests

from service.config import Config

ROOT = Path(__file__).resolve().parent.parent
# Every prompt generates exactly max_tokens on every path (as vLLM's own benchmarks do), so that
# a prompt the model happens to end early does not make one path look faster than another.
SAME_WORK = {"ignore_eos": True, "details": True}
TIMEOUT_S = 600
TOPICS = "the sea|mountains|coffee|bicycles|libraries|rain|the moon|bread|trains|music|gardens|winter|robots|rivers"
TOPICS = f"{TOPICS}|chess|bees".split("|")
TEMPLATES = ("Write one sentence about {}.", "Give a fun fact about {}.", "Explain {} to a child.")
TEMPLATES += ("List three words related to {}.",)


def make_prompts(n: int) -> list[str]:
    """n distinct short prompts, the same on every call and for every path."""
    out = [TEMPLATES[(i // len(TOPICS)) % len(TEMPLATES)].format(TOPICS[i % len(TOPICS)]) for i in range(n)]
    return [p if i < len(TOPICS) * len(TEMPLATES) else f"{p} ({i})" for i, p in enumerate(out)]


@dataclass
class Run:
    seconds: float
    rounds: int  # distinct `round` values in the details (vLLM: admission steps)
    latencies_ms: list[float]  # per prompt: queue_ms + inference_ms


def _post(url: str, path: str, body: dict) -> list[dict]:
    resp = requests.post(url + path, json={**body, **SAME_WORK}, timeout=TIMEOUT_S)
    if resp.status_code != 200:
        raise RuntimeError(f"POST {path} -> {resp.status_code}: {resp.text[:300]}")
    return resp.json()["details"]


def _run(seconds: float, details: list[dict]) -> Run:
    return Run(seconds, len({d["round"] for d in details}), [d["queue_ms"] + d["inference_ms"] for d in details])


def one_request(url: str, path: str, prompts: list[str], max_tokens: int) -> Run:
    """One request carrying every prompt."""
    started = time.perf_counter()
    details = _post(url, path, {"prompts": prompts, "max_tokens": max_tokens})
    if len(details) != len(prompts):
        raise RuntimeError(f"{path}: {len(details)} completions for {len(prompts)} prompts")
    return _run(time.perf_counter() - started, details)


def concurrent(url: str, path: str, prompts: list[str], max_tokens: int) -> Run:
    """One single-prompt request per prompt, all in flight at once (threads released together)."""
    gate = threading.Barrier(len(prompts) + 1)

    def call(prompt: str) -> tuple[float, list[dict]]:
        gate.wait()
        details = _post(url, path, {"prompts": [prompt], "max_tokens": max_tokens})
        return time.perf_counter(), details

    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        futures = [pool.submit(call, p) for p in prompts]
        gate.wait(timeout=60)
        started = time.perf_counter()
        results = [f.result() for f in futures]
    return _run(max(end for end, _ in results) - started, [d for _, ds in results for d in ds])


def sequential_basic(url: str, prompts: list[str], max_tokens: int) -> Run:
    """/basic_generate, one prompt after the other: the no-batching baseline."""
    started = time.perf_counter()
    details = [d for p in prompts for d in _post(url, "/basic_generate", {"prompt": p, "max_tokens": max_tokens})]
    return _run(time.perf_counter() - started, details)


def summarize(runs: list[float]) -> dict:
    return {"runs": runs, "median": statistics.median(runs), "min": min(runs), "max": max(runs)}


def cell(path: str, method: str, n: int, repeats: int, fn: Callable[[], Run]) -> dict:
    """Repeat one measurement; the cell's median and spread (min-max) over the repeats."""
    runs = [fn() for _ in range(repeats)]
    out = {"path": path, "method": method, "n": n, "repeats": repeats, **summarize([r.seconds for r in runs])}
    out["rounds"] = [r.rounds for r in runs]
    print(f"  N={n:<3} {path:>6} {method:<10} {out['median']:8.3f} s  [{out['min']:.3f}-{out['max']:.3f}]", flush=True)
    return out


def percentile(values: list[float], pct: float) -> float:
    """Nearest rank."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


# --- baselines, run in a subprocess ---------------------------------------------------------------
def run_baseline(kind: str, prompts: list[str], repeats: int, max_tokens: int, log_path: Path) -> dict:
    """`python -m bench.measure KIND` in its own process; its output goes to `log_path`."""
    spec = json.dumps({"prompts": prompts, "repeats": repeats, "max_tokens": max_tokens})
    out_path = log_path.with_suffix(f".{kind}.json")
    try:
        with open(log_path, "a") as log:
            cmd = [sys.executable, "-m", "bench.measure", kind, spec, str(out_path)]
            subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=900, check=True)
        result = json.loads(out_path.read_text())
    finally:
        out_path.unlink(missing_ok=True)
    return {**result, **summarize(result["runs"]), "n": len(prompts)}


def _timed(fn: Callable[[], object], repeats: int) -> list[float]:
    fn()  # warm-up
    runs = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - started)
    return runs


def _direct(spec: dict, config: Config) -> dict:
    """Bare `model.generate()` (and the service's own `Runner.generate`) on the same prompts."""
    import torch

    from batcher.checkpoint import resolve_model
    from batcher.runner import Runner, set_torch_threads
    from batcher.sequence import SamplingParams, Sequence

    set_torch_threads(config.torch_threads)  # as the service's model thread does
    runner = Runner(resolve_model(config.model, config.cache_dir), dtype=config.dtype, device=config.device)
    prompts, n = spec["prompts"], spec["max_tokens"]

    @torch.inference_mode()
    def bare() -> None:
        inputs, pad = runner.encode(prompts), runner.tokenizer.pad_token_id
        runner.model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=pad)

    def service_round() -> None:
        seqs = [Sequence(p, SamplingParams(max_tokens=n, ignore_eos=True)) for p in prompts]
        runner.generate(seqs, runner.encode(prompts))

    runner_runs, bare_runs = _timed(service_round, spec["repeats"]), _timed(bare, spec["repeats"])
    return {"dtype": str(runner.dtype), "runs": bare_runs, "runner_generate": summarize(runner_runs)}


def _offline(spec: dict, config: Config) -> dict:
    """Offline `vllm.LLM.generate()`, built with the service's own vLLM settings."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # as VLLMWorker does, before vllm is imported
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(config.vllm_kv_cache_gib))
    from vllm import LLM, SamplingParams

    from batcher.checkpoint import resolve_model
    from batcher.compile_cache import use_compile_cache
    from batcher.device import pick_device, pick_dtype
    from batcher.vllm_worker import resolve_enforce_eager

    device = pick_device("auto")
    use_compile_cache(config.compile_cache_dir, device)  # as the service
    dtype = str(pick_dtype(config.dtype, device)).removeprefix("torch.")
    started = time.perf_counter()
    llm = LLM(
        model=resolve_model(config.model, config.cache_dir),
        dtype=dtype,
        max_model_len=config.vllm_max_model_len,
        max_num_seqs=config.vllm_max_num_seqs,
        gpu_memory_utilization=config.vllm_gpu_memory_utilization,
        enforce_eager=resolve_enforce_eager(config.vllm_enforce_eager, device),
    )
    load_seconds = time.perf_counter() - started
    params = SamplingParams(max_tokens=spec["max_tokens"], temperature=0, ignore_eos=True)
    runs = _timed(lambda: llm.generate(spec["prompts"], params, use_tqdm=False), spec["repeats"])
    return {"dtype": dtype, "load_seconds": load_seconds, "runs": runs}


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    kind, spec, out_file = sys.argv[1:4]
    result = {"direct": _direct, "offline": _offline}[kind](json.loads(spec), Config.from_env())
    Path(out_file).write_text(json.dumps(result))
