"""One engine alone in its own process: the profile's candidates and the bench's baselines.

A spec: the engine ("static": the service's Runner; "vllm": `vllm.LLM`), its `settings` (the
fields of StaticSettings or VLLMSettings, every auto already resolved), `compile_cache_dir`,
`texts` to complete greedily to `max_tokens`, `timed` prompt lists (`timed_tokens` each, after a
warm-up, `repeats` runs; `bare`: transformers' generate() too). `run(spec, log, timeout)` starts
`python -m batcher.profile.child` and returns what it measured (start and compile seconds,
completions' token ids, run seconds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import timeit
from functools import partial
from pathlib import Path

from batcher.compile_cache import use_compile_cache
from batcher.settings import StaticSettings, VLLMSettings

ROOT = Path(__file__).resolve().parent.parent.parent


def run(spec: dict, log, timeout: float = 1200) -> dict:
    """`spec` in its own process, its output to the open file `log`; raises
    subprocess.TimeoutExpired past `timeout` (the child killed) and CalledProcessError on a failure."""
    with tempfile.TemporaryDirectory() as tmp:
        out_path, env = Path(tmp, "out.json"), {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # as the service
        cmd = [sys.executable, "-m", "batcher.profile.child", json.dumps(spec), str(out_path)]
        log.flush()
        subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, check=True)
        return json.loads(out_path.read_text())


def _static(settings: StaticSettings) -> tuple:
    """What it built; generate(prompts, max_tokens, ignore_eos): token ids, in rounds of BATCH_SIZE;
    transformers' own generate() on the same model, the static overhead's reference."""
    import torch

    from batcher.sampling import SamplingParams
    from batcher.sequence import Sequence
    from batcher.static.runner import Runner, set_torch_threads

    set_torch_threads(settings.torch_threads)  # as the service's model thread does
    started, size = time.perf_counter(), settings.batch_size
    runner = Runner(settings)
    compile_s = runner.warm_up() if runner.compiles else None
    built = {"start_s": time.perf_counter() - started, "compile_s": compile_s, "dtype": str(runner.dtype)}

    def generate(prompts: list[str], max_tokens: int, ignore_eos: bool = True) -> list[list[int]]:
        seqs = [Sequence(p, SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)) for p in prompts]
        for i in range(0, len(seqs), size):
            runner.generate(seqs[i : i + size], runner.encode(prompts[i : i + size]))
        return [list(s.token_ids) for s in seqs]

    @torch.inference_mode()
    def bare(prompts: list[str], n: int) -> None:
        pad = runner.tokenizer.pad_token_id
        runner.model.generate(
            **runner.encode(prompts), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=pad
        )

    return built, generate, bare


def _vllm(settings: VLLMSettings) -> tuple:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings.kv_cache_gib))
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    names = ("dtype", "enforce_eager", "max_model_len", "max_num_seqs", "gpu_memory_utilization")
    llm = LLM(model=settings.model_path, **{name: getattr(settings, name) for name in names})
    built, eos = {"start_s": time.perf_counter() - started, "dtype": settings.dtype}, llm.get_tokenizer().eos_token_id

    def generate(prompts: list[str], max_tokens: int, ignore_eos: bool = True) -> list[list[int]]:
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=ignore_eos)
        outs = llm.generate(prompts, params, use_tqdm=False)  # EOS is not in the static path's tokens: dropped
        return [[t for t in o.outputs[0].token_ids if t != eos] for o in outs]

    return built, generate, None


def main(spec: dict, out_path: str) -> None:
    kind = {"static": (StaticSettings, _static), "vllm": (VLLMSettings, _vllm)}[spec["engine"]]
    settings = kind[0](**spec["settings"])
    use_compile_cache(spec.get("compile_cache_dir", ""), settings.device)  # as the service does
    built, generate, bare = kind[1](settings)
    if spec.get("texts"):
        built["completions"] = generate(spec["texts"], spec["max_tokens"], ignore_eos=False)
    for key, fn in {"runs": generate, **({"bare_runs": bare} if spec.get("bare") else {})}.items():
        timed = [partial(fn, prompts, spec["timed_tokens"]) for prompts in spec.get("timed", [])]  # after a warm-up
        built[key] = [timeit.repeat(one, "gc.enable()", number=1, repeat=spec["repeats"] + 1)[1:] for one in timed]
    Path(out_path).write_text(json.dumps(built))


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    main(json.loads(sys.argv[1]), sys.argv[2])
