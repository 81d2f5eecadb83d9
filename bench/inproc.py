"""The engines without the service, each in its own process: the baselines and fidelity. A spec
names the engine ("static": the service's Runner; "vllm": `vllm.LLM`), dtype, eager, `texts` to
complete greedily to `max_tokens`, and `timed` prompt lists (`timed_tokens`, a warm-up, `repeats`
runs; `bare`: transformers' generate() too). All else is the service's own `Config.from_env()`."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from service.config import Config

ROOT = Path(__file__).resolve().parent.parent


def run(spec: dict, log) -> dict:
    """`spec` in its own process, its output to the open file `log`; what it returns."""
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = Path(tmp, "spec.json"), Path(tmp, "out.json")
        spec_path.write_text(json.dumps(spec))
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # as the service, before vllm loads
        cmd = [sys.executable, "-m", "bench.inproc", str(spec_path), str(out_path)]
        log.flush()
        subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=1200, check=True)
        return json.loads(out_path.read_text())


def _timed(fn, spec: dict) -> list[list[float]]:
    """Per prompt list in spec["timed"]: a warm-up, then the seconds of each of `repeats` runs."""
    out = []
    for prompts in spec["timed"]:
        fn(prompts)
        runs = []
        for _ in range(spec["repeats"]):
            started = time.perf_counter()
            fn(prompts)
            runs.append(time.perf_counter() - started)
        out.append(runs)
    return out


def _static(spec: dict, config: Config, model_path: str) -> dict:
    import torch

    from batcher.runner import Runner, set_torch_threads
    from batcher.sequence import SamplingParams, Sequence

    set_torch_threads(config.torch_threads)  # as the service's model thread does
    started = time.perf_counter()
    size = spec.get("round", config.batch_size)  # rounds of BATCH_SIZE, as the service runs them
    settings = dataclasses.replace(
        config, dtype=spec["dtype"], static_compile="0" if spec["eager"] else "1", batch_size=size
    )
    runner = Runner(settings.static_engine(model_path))
    compile_s = runner.warm_up() if runner.compiles else 0.0
    out = {"start_s": time.perf_counter() - started, "compile_s": compile_s, "dtype": str(runner.dtype)}

    def rounds(prompts: list[str], max_tokens: int = spec["timed_tokens"], ignore_eos: bool = True) -> list:
        seqs = [Sequence(p, SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)) for p in prompts]
        for i in range(0, len(seqs), size):
            runner.generate(seqs[i : i + size], runner.encode(prompts[i : i + size]))
        return [list(s.token_ids) for s in seqs]

    @torch.inference_mode()
    def bare(prompts: list[str]) -> None:  # transformers alone: the static overhead's reference
        inputs, n, pad = runner.encode(prompts), spec["timed_tokens"], runner.tokenizer.pad_token_id
        runner.model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=pad)

    if spec.get("texts"):
        out["completions"] = rounds(spec["texts"], spec["max_tokens"], ignore_eos=False)
    return {**out, "runs": _timed(rounds, spec), **({"bare_runs": _timed(bare, spec)} if spec.get("bare") else {})}


def _vllm(spec: dict, config: Config, model_path: str) -> dict:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(config.vllm_kv_cache_gib))
    from flask import Flask
    from vllm import LLM, SamplingParams

    from batcher.device import pick_device, pick_dtype

    dtype = str(pick_dtype(spec["dtype"], pick_device(config.device))).removeprefix("torch.")
    started = time.perf_counter()
    # vLLM's CPU backend hasattr()s every attribute of every imported module, and Flask's
    # context-local proxies (imported with service.config) raise outside a context: give it one
    with Flask(__name__).test_request_context():
        llm = LLM(
            model=model_path,
            dtype=dtype,
            enforce_eager=spec["eager"],
            max_model_len=config.vllm_max_model_len,
            max_num_seqs=config.vllm_max_num_seqs,
            gpu_memory_utilization=config.vllm_gpu_memory_utilization,
        )
    out = {"start_s": time.perf_counter() - started, "dtype": dtype}
    if spec.get("texts"):
        outs = llm.generate(spec["texts"], SamplingParams(max_tokens=spec["max_tokens"], temperature=0), use_tqdm=False)
        eos = llm.get_tokenizer().eos_token_id  # not in the static path's tokens: dropped, like for like
        out["completions"] = [[t for t in o.outputs[0].token_ids if t != eos] for o in outs]
    fixed = SamplingParams(max_tokens=spec["timed_tokens"], temperature=0, ignore_eos=True)
    return {**out, "runs": _timed(lambda prompts: llm.generate(prompts, fixed, use_tqdm=False), spec)}


if __name__ == "__main__":
    import logging

    from batcher.checkpoint import resolve_model
    from batcher.compile_cache import use_compile_cache
    from batcher.device import pick_device

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    spec, config = json.loads(Path(sys.argv[1]).read_text()), Config.from_env()
    use_compile_cache(config.compile_cache_dir, pick_device(config.device))  # as the service does
    engine = {"static": _static, "vllm": _vllm}[spec["engine"]]
    Path(sys.argv[2]).write_text(json.dumps(engine(spec, config, resolve_model(config.model, config.cache_dir))))
