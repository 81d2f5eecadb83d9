"""The batch phase: one chat batch file (distinct short prompts, `max_tokens` drawn from a range
with a fixed seed, greedy, `ignore_eos` so that every line makes exactly its `max_tokens`) run
through the service's Files and Batches API on each engine, the service otherwise idle, from
batch creation to `completed`; then, per engine, interactive streams with and without a batch
running behind them (a batch takes only the spare room: bench/spare_room.py); then vLLM's own
offline `run_batch` on the same file, alone, the service stopped."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import openai

from batcher.compile_cache import use_compile_cache
from bench import measure, spare_room
from bench.batch_api import BASES, BATCH_TIMEOUT_S, CHAT, client, jsonl, submit, wait_ended
from service.config import Config

LINES = 1000  # the default batch; --batch-lines for fewer
TOKENS = (20, 64)  # each line's max_tokens, drawn from this range (inclusive)
SEED = 0
ENGINE_LOADED = b"Reading batch from"  # run_batch logs it once its engine is built, before any line
RUN_BATCH = ("vLLM run_batch, start to exit", "vLLM run_batch, engine built to exit")
ERRORS = (OSError, RuntimeError, ValueError, KeyError, subprocess.SubprocessError, openai.OpenAIError)


def make_lines(n: int) -> list[dict]:
    """n batch lines, the same on every call: the grid's prompts as chat messages."""
    rng = random.Random(SEED)
    return [
        {"custom_id": f"line-{i}", "method": "POST", "url": CHAT, "body": {
            "messages": [{"role": "user", "content": prompt}], "max_tokens": rng.randint(*TOKENS),
            "temperature": 0, **measure.SAME_WORK}}
        for i, prompt in enumerate(measure.make_prompts(n))
    ]  # fmt: skip


def answered(outputs: bytes) -> tuple[int, int]:
    """(lines answered 200, their output tokens) in an output file, ours or run_batch's."""
    ok = tokens = 0
    for line in filter(None, outputs.decode().splitlines()):
        response = json.loads(line).get("response") or {}
        if response.get("status_code") == 200:
            ok, tokens = ok + 1, tokens + response["body"]["usage"]["completion_tokens"]
    return ok, tokens


def row(run: str, machine: str, lines: list[dict], seconds: float, ok: int, tokens: int) -> dict:
    asked = sum(line["body"]["max_tokens"] for line in lines)
    return {"run": run, "machine": machine, "lines": len(lines), "answered 200": ok, "wall (s)": round(seconds, 1),
            "lines/s": round(ok / seconds, 2), "output tokens/s": round(tokens / seconds, 1),
            "output tokens (asked)": f"{tokens} ({asked})"}  # fmt: skip


def throughput(url: str, engine: str, lines: list[dict], machine: str) -> dict:
    """The whole file as one batch on `engine`: seconds from its creation to its end."""
    sdk = client(url, engine)
    started, batch_id = submit(sdk, jsonl(lines))
    batch = wait_ended(sdk, batch_id)
    seconds = time.perf_counter() - started
    if batch.status != "completed" or batch.output_file_id is None:
        raise RuntimeError(f"batch {batch_id} on {engine}: {batch.status}, errors {batch.errors}")
    ok, tokens = answered(sdk.files.content(batch.output_file_id).content)
    out = row(f"ours {BASES[engine]} ({engine} engine)", machine, lines, seconds, ok, tokens)
    print(f"  {out}", flush=True)
    return out


def ready_engines(health: dict) -> list[str]:
    """The engines a batch can run on now, vLLM's first: /health's body as Server gives it."""
    return [engine for engine in BASES if health.get("engines", {}).get(engine, {}).get("status") == "ready"]


def on_service(url: str, engines: list[str], lines: list[dict], max_tokens: int, machine: str) -> dict:
    """Per engine: a warm-up, the batch's throughput, then the spare room; a failure is noted."""
    out: dict = {"batch": [], "batch_spare_room": [], "failed": []}
    for engine in engines:
        try:
            spare_room.warm(url, engine, max_tokens)
            out["batch"].append(throughput(url, engine, lines, machine))
            sdk = client(url, engine)
            out["batch_spare_room"].append(spare_room.compare(url, engine, sdk, jsonl(lines), max_tokens))
        except ERRORS as exc:
            out["failed"].append(f"batch on {engine}: {str(exc)[:300]}")
            print(f"  batch on {engine}: failed: {exc}", flush=True)
    return out


def run_batch(model_path: str, lines: list[dict], log_path: Path, machine: str) -> list[dict]:
    """vLLM's `run_batch` on the same file at the settings our vLLM engine resolved (as the peers
    phase starts vLLM's server): seconds from its start to its exit, and from the moment it
    logged its engine built to its exit (what ours is timed on: a service already loaded)."""
    config = Config.from_env()
    vllm = config.vllm_engine(model_path)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.update(use_compile_cache(config.compile_cache_dir, "cpu"))
    with tempfile.TemporaryDirectory(prefix="run-batch-") as folder:
        source, target = Path(folder) / "in.jsonl", Path(folder) / "out.jsonl"
        source.write_bytes(jsonl(lines))
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(source), "-o", str(target),
               "--model", model_path, "--dtype", vllm.dtype, "--max-model-len", str(vllm.max_model_len),
               "--max-num-seqs", str(vllm.max_num_seqs),
               "--kv-cache-memory-bytes", str(vllm.kv_cache_bytes)]  # fmt: skip
        cmd += ["--enforce-eager"] if vllm.enforce_eager else []
        started, loaded = time.perf_counter(), None
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
            watchdog = threading.Timer(BATCH_TIMEOUT_S, _kill, (proc,))
            watchdog.start()
            try:
                for text in proc.stdout:
                    log.write(text)
                    if loaded is None and ENGINE_LOADED in text:
                        loaded = time.perf_counter()
                returncode = proc.wait()
            finally:
                watchdog.cancel()
                _kill(proc)
        ended = time.perf_counter()
        if returncode != 0 or not target.exists():
            raise RuntimeError(f"run_batch exited with code {returncode} (log: {log_path})")
        ok, tokens = answered(target.read_bytes())
    rows = [row(RUN_BATCH[0], machine, lines, ended - started, ok, tokens)]
    if loaded is not None:
        rows.append(row(RUN_BATCH[1], machine, lines, ended - loaded, ok, tokens))
    for out in rows:
        print(f"  {out}", flush=True)
    return rows


def beside_run_batch(out: dict, model_path: str, lines: list[dict], log_path: Path, machine: str) -> None:
    """run_batch's rows added to `out`, or the reason it failed noted there."""
    try:
        out["batch"] += run_batch(model_path, lines, log_path, machine)
    except ERRORS as exc:
        out["failed"].append(f"batch: vLLM's run_batch: {str(exc)[:300]}")


def _kill(proc: subprocess.Popen) -> None:
    """The whole session run_batch leads (its engine's process too), whether or not it has exited."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def ratios(out: dict) -> dict:
    """Each of our rows against run_batch (engine built to exit, else start to exit), and the
    figures the targets read."""
    rates = {r["run"]: r["lines/s"] for r in out["batch"]}
    theirs = rates.get(RUN_BATCH[1]) or rates.get(RUN_BATCH[0])
    for r in out["batch"]:
        mine = r["run"].startswith("ours") and r["lines/s"]
        r["run_batch/this"] = f"{theirs / r['lines/s']:.2f}x" if theirs and mine else None
    ours = rates.get(f"ours {BASES['vllm']} (vllm engine)")
    spare = {r["engine"]: r for r in out["batch_spare_room"]}
    return {
        "run_batch_over_v1": theirs / ours if theirs and ours else None,
        "ttft_with_over_alone": {e: r["with/alone"] for e, r in spare.items()},
        "added_429": {e: max(0, r["429 with a batch"] - r["429 alone"]) for e, r in spare.items()},
    }
