"""The engines without the service, each in its own process: the baselines and fidelity. A spec:
the engine ("static": the service's Runner; "vllm": `vllm.LLM`), `config` (overrides of the
service's `Config.from_env()`), `texts` to complete greedily to `max_tokens`, `timed` prompt lists
(`timed_tokens`, a warm-up, `repeats` runs; `bare`: transformers' generate() too). Fidelity: the
completions of bench/prompts.json (chat template) against the static engine's in fp32 eager."""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from functools import partial
from pathlib import Path

from batcher.checkpoint import resolve_model
from batcher.compile_cache import use_compile_cache
from bench.measure import make_prompts
from service.config import Config

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = json.loads((ROOT / "bench" / "prompts.json").read_text())
PARIS_PROMPT = "What is the capital of France?"
# (engine, dtype, eager); the first is the reference. "static" is the service's own Runner
# (compiled: STATIC_COMPILE=1, its start includes compiling the first graph).
CONFIGS = [("static", "float32", True), ("static", "float32", False), ("static", "bfloat16", True)]
CONFIGS += [("vllm", dtype, eager) for dtype in ("bfloat16", "float32") for eager in (False, True)]
SPEED_N = {"static": (4,), "vllm": (4, 64)}  # prompts per timed call


def run(spec: dict, log) -> dict:
    """`spec` in its own process, its output to the open file `log`; what it returns."""
    with tempfile.TemporaryDirectory() as tmp:
        out_path, env = Path(tmp, "out.json"), {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # as the service
        cmd = [sys.executable, "-m", "bench.inproc", json.dumps(spec), str(out_path)]
        log.flush()
        subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=1200, check=True)
        return json.loads(out_path.read_text())


def _static(config: Config, model_path: str) -> tuple:
    """What it built; generate(prompts, max_tokens, ignore_eos): token ids, in rounds of BATCH_SIZE;
    transformers' own generate() on the same model, the static overhead's reference."""
    import torch

    from batcher.sampling import SamplingParams
    from batcher.sequence import Sequence
    from batcher.static.runner import Runner, set_torch_threads

    set_torch_threads(config.torch_threads)  # as the service's model thread does
    started, size = time.perf_counter(), config.batch_size
    runner = Runner(config.static_engine(model_path))
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


def _vllm(config: Config, model_path: str) -> tuple:
    settings = config.vllm_engine(model_path)  # the service's own resolution of dtype and eager
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings.kv_cache_gib))
    from flask import Flask
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    # vLLM's CPU backend hasattr()s every attribute of every imported module, and Flask's
    # context-local proxies (imported with service.config) raise outside a context: give it one
    with Flask(__name__).test_request_context():
        names = ("dtype", "enforce_eager", "max_model_len", "max_num_seqs", "gpu_memory_utilization")
        llm = LLM(model=model_path, **{name: getattr(settings, name) for name in names})
    built, eos = {"start_s": time.perf_counter() - started, "dtype": settings.dtype}, llm.get_tokenizer().eos_token_id

    def generate(prompts: list[str], max_tokens: int, ignore_eos: bool = True) -> list[list[int]]:
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=ignore_eos)
        outs = llm.generate(prompts, params, use_tqdm=False)  # EOS is not in the static path's tokens: dropped
        return [[t for t in o.outputs[0].token_ids if t != eos] for o in outs]

    return built, generate, None


def _agreeing_prefix(a: list[int], b: list[int]) -> float:
    same = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return same / max(len(a), len(b)) if a or b else 1.0


def fidelity(log_path: Path) -> list[dict]:
    """Per configuration: exact matches, the mean agreeing-prefix fraction (tokens agreeing from the
    start / the longer), France -> Paris, its build and decode seconds."""
    from transformers import AutoTokenizer

    config = Config.from_env()
    tok = AutoTokenizer.from_pretrained(resolve_model(config.model, config.cache_dir))
    chat = [[{"role": "user", "content": p}] for p in PROMPTS]
    texts = [tok.apply_chat_template(turn, tokenize=False, add_generation_prompt=True) for turn in chat]
    rows, reference = [], None
    with open(log_path, "a") as log:
        for engine, dtype, eager in CONFIGS:
            flag, value = ("vllm_enforce_eager", eager) if engine == "vllm" else ("static_compile", not eager)
            overrides = {"dtype": dtype, "batch_size": 4, flag: str(int(value))}
            spec = dict(engine=engine, config=overrides, texts=texts, max_tokens=24, timed_tokens=20, repeats=3)
            result = run({**spec, "timed": [make_prompts(n) for n in SPEED_N[engine]]}, log)
            reference = reference or result["completions"]
            pairs = list(zip(reference, result["completions"], strict=True))
            paris = tok.decode(result["completions"][PROMPTS.index(PARIS_PROMPT)], skip_special_tokens=True)
            speed = dict(zip(SPEED_N[engine], result["runs"], strict=True))
            rows.append({
                "engine": engine, "dtype": dtype, "decoding": "eager" if eager else "compiled",
                "exact (vs static fp32 eager)": f"{sum(a == b for a, b in pairs)}/{len(pairs)}",
                "agreeing prefix": round(statistics.mean(_agreeing_prefix(a, b) for a, b in pairs), 2),
                "France -> Paris": "yes" if "Paris" in paris else "no: " + paris[:40].replace("\n", " "),
                "start (s)": round(result["start_s"], 1),
                "first graph compiled (s)": result.get("compile_s") and round(result["compile_s"], 1),
                **{f"{n} prompts (s)": round(statistics.median(speed[n]), 2) if n in speed else None for n in (4, 64)},
            })  # fmt: skip
            print(f"  {rows[-1]}", flush=True)
    return rows


if __name__ == "__main__":
    import logging

    from batcher.device import pick_device

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    spec = json.loads(sys.argv[1])
    config = Config.from_env(**spec.get("config", {}))
    model_path = resolve_model(config.model, config.cache_dir)
    use_compile_cache(config.compile_cache_dir, pick_device(config.device))  # as the service does
    built, generate, bare = {"static": _static, "vllm": _vllm}[spec["engine"]](config, model_path)
    if spec.get("texts"):
        built["completions"] = generate(spec["texts"], spec["max_tokens"], ignore_eos=False)
    for key, fn in {"runs": generate, **({"bare_runs": bare} if spec.get("bare") else {})}.items():
        timed = [partial(fn, prompts, spec["timed_tokens"]) for prompts in spec["timed"]]  # after a warm-up; GC on
        built[key] = [timeit.repeat(run, "gc.enable()", number=1, repeat=spec["repeats"] + 1)[1:] for run in timed]
    Path(sys.argv[2]).write_text(json.dumps(built))
