"""One engine alone in its own process: the profile's candidates and the bench's baselines.

A spec: the engine ("static": the service's Runner; "vllm": `vllm.LLM`), its `settings` (the
fields of StaticSettings or VLLMSettings, every auto already resolved), `compile_cache_dir`,
`texts` to complete greedily to `max_tokens`, `timed` prompt lists (`timed_tokens` each, after a
warm-up, `repeats` runs; `bare`: transformers' generate() too). `run(spec, log, timeout)` starts
`python -m batcher.profile.child` for one spec (the bench's baselines) and returns what it
measured; `--serve ENGINE` keeps one process for many candidates (batcher/profile/session.py
drives it, batcher/profile/candidate.py measures each): the imports are paid once.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import timeit
from functools import partial
from pathlib import Path
from types import SimpleNamespace

from batcher.compile_cache import import_torch_first, use_compile_cache
from batcher.memory import release_free_memory, resident_mib
from batcher.settings import StaticSettings, VLLMSettings

ROOT = Path(__file__).resolve().parent.parent.parent
ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # vLLM's engine core in this process, as the service


def run(spec: dict, log, timeout: float = 1200) -> dict:
    """`spec` in its own process, its output to the open file `log`; raises
    subprocess.TimeoutExpired past `timeout` (the child killed) and CalledProcessError on a failure."""
    with tempfile.TemporaryDirectory() as tmp:
        out_path, env = Path(tmp, "out.json"), {**os.environ, **ENV}
        cmd = [sys.executable, "-m", "batcher.profile.child", json.dumps(spec), str(out_path)]
        log.flush()
        subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, check=True)
        return json.loads(out_path.read_text())


def _static(settings: StaticSettings) -> SimpleNamespace:
    """What it built; generate(prompts, max_tokens, ignore_eos, size): token ids, in rounds of
    `size` (BATCH_SIZE unless told); bare: transformers' own generate() on the same model, the
    static overhead's reference; decode: the tokenizer's."""
    import torch

    from batcher.sampling import SamplingParams
    from batcher.sequence import Sequence
    from batcher.static import graphs
    from batcher.static.runner import Runner, set_torch_threads

    set_torch_threads(settings.torch_threads)  # as the service's model thread does
    started, batch = time.perf_counter(), settings.batch_size
    runner, compile_s, aside = Runner(settings), None, graphs.builds_aside(settings)
    if runner.compiles:  # its graphs stored on a CPU too: a service start with these settings loads them
        compile_s = graphs.build(runner, runner.first_shapes()) if aside else runner.warm_up()
    start_s = time.perf_counter() - started
    built = {"start_s": start_s, "compile_s": compile_s, "dtype": str(runner.dtype)}
    # a later start: the same again (compiled where nothing is stored: its compile too)
    built.update(stored=not runner.compiles or aside, warm_start_s=start_s)
    if runner.compiles and aside:  # a later start loads what this one stored: measured as one would
        runner = None
        release_free_memory()
        built["memory_base_mib"] = resident_mib()  # not the compiler's memory: a worker never compiles
        started, runner = time.perf_counter(), Runner(settings)
        for shape in runner.first_shapes():
            if (graph := graphs.load(settings, shape)) is None:
                raise RuntimeError(f"the graph of {shape} stored just now cannot be loaded (the log says why)")
            runner.use_graph(shape, graph)
        built["warm_start_s"] = time.perf_counter() - started

    def generate(prompts: list[str], max_tokens: int, ignore_eos: bool = True, size: int = 0) -> list[list[int]]:
        seqs = [Sequence(p, SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)) for p in prompts]
        size = size or batch
        for i in range(0, len(seqs), size):
            runner.generate(seqs[i : i + size], runner.encode(prompts[i : i + size]))
        return [list(s.token_ids) for s in seqs]

    @torch.inference_mode()
    def bare(prompts: list[str], n: int) -> None:
        pad = runner.tokenizer.pad_token_id
        runner.model.generate(
            **runner.encode(prompts), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=pad
        )

    decode = partial(runner.tokenizer.decode, skip_special_tokens=True)
    return SimpleNamespace(built=built, generate=generate, bare=bare, decode=decode, batch=settings.batch_size)


def _vllm(settings: VLLMSettings) -> SimpleNamespace:
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(**settings.engine_args())  # the service's engine's arguments
    start_s, tok = time.perf_counter() - started, llm.get_tokenizer()
    # a later start loads its compiled graphs from vLLM's cache: at most this start's seconds
    built = {"start_s": start_s, "dtype": settings.dtype, "stored": True, "warm_start_s": start_s}

    def generate(prompts: list[str], max_tokens: int, ignore_eos: bool = True, size: int = 0) -> list[list[int]]:
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=ignore_eos)
        outs = llm.generate(prompts, params, use_tqdm=False)  # EOS is not in the static path's tokens: dropped
        return [[t for t in o.outputs[0].token_ids if t != tok.eos_token_id] for o in outs]

    decode = partial(tok.decode, skip_special_tokens=True)
    return SimpleNamespace(built=built, generate=generate, bare=None, decode=decode, batch=0)


BUILDERS = {"static": (StaticSettings, _static), "vllm": (VLLMSettings, _vllm)}


def build(spec: dict) -> SimpleNamespace:
    kind = BUILDERS[spec["engine"]]
    settings = kind[0](**spec["settings"])
    import_torch_first()  # as the service does: the compile caches' keys depend on it
    use_compile_cache(spec.get("compile_cache_dir", ""), settings.device)  # as the service does
    return kind[1](settings)


def main(spec: dict, out_path: str) -> None:
    engine = build(spec)
    built = engine.built
    if spec.get("texts"):
        built["completions"] = engine.generate(spec["texts"], spec["max_tokens"], ignore_eos=False)
    for key, fn in {"runs": engine.generate, **({"bare_runs": engine.bare} if spec.get("bare") else {})}.items():
        timed = [partial(fn, prompts, spec["timed_tokens"]) for prompts in spec.get("timed", [])]  # after a warm-up
        built[key] = [timeit.repeat(one, "gc.enable()", number=1, repeat=spec["repeats"] + 1)[1:] for one in timed]
    Path(out_path).write_text(json.dumps(built))


def serve(engine: str, result_fd: int, compile_cache_dir: str, device: str) -> None:
    """Candidates of `engine` from stdin, one JSON spec a line; every event of each (candidate.py)
    to `result_fd`, one JSON object a line, the first {"event": "ready", memory_mib} once the
    engine's imports are done (a cost of the engine, not of its first candidate). Each engine built is dropped
    before the next."""
    import importlib

    from batcher.profile import candidate

    import_torch_first()  # as the service does: the compile caches' keys depend on it
    use_compile_cache(compile_cache_dir, device)  # before the imports: what they read stays ours
    importlib.import_module({"static": "batcher.static.runner", "vllm": "vllm"}[engine])
    with os.fdopen(result_fd, "w", buffering=1) as out:
        emit = lambda event: out.write(json.dumps(event) + "\n")  # noqa: E731
        emit({"event": "ready", "memory_mib": resident_mib()})  # its imports: a worker's too
        for line in sys.stdin:
            candidate.measure(json.loads(line), build, emit)
            gc.collect()  # the engine just measured (a vLLM LLM holds its KV cache) goes before the next


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if sys.argv[1] == "--serve":
        serve(sys.argv[2], int(sys.argv[3]), *sys.argv[4:6])
    else:
        main(json.loads(sys.argv[1]), sys.argv[2])
