"""Timed HTTP calls against the service: one timing helper, the grid's three methods, the time to
first token."""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import requests

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


def timed_post(url: str, path: str, body: dict, *, stream: bool = False) -> tuple[float, requests.Response]:
    """The one HTTP timing helper: POST, raise unless 200; seconds until the whole answer (a
    stream: its first `data:` line), and the response."""
    started = time.perf_counter()
    resp = requests.post(url + path, json=body, timeout=TIMEOUT_S, stream=stream)
    if resp.status_code != 200:
        raise RuntimeError(f"POST {path} -> {resp.status_code}: {resp.text[:300]}")
    if stream:
        next(line for line in resp.iter_lines() if line.startswith(b"data: "))
        resp.close()
    return time.perf_counter() - started, resp


@dataclass
class Run:
    seconds: float
    details: list[dict]

    @property
    def rounds(self) -> int:  # distinct `round` values in the details (vLLM: admission steps)
        return len({d["round"] for d in self.details})

    @property
    def latencies_ms(self) -> list[float]:  # per prompt: queue_ms + inference_ms
        return [d["queue_ms"] + d["inference_ms"] for d in self.details]


def _post(url: str, path: str, body: dict) -> Run:
    seconds, resp = timed_post(url, path, {**body, **SAME_WORK})
    return Run(seconds, resp.json()["details"])


def one_request(url: str, path: str, prompts: list[str], max_tokens: int) -> Run:
    """One request carrying every prompt."""
    run = _post(url, path, {"prompts": prompts, "max_tokens": max_tokens})
    if len(run.details) != len(prompts):
        raise RuntimeError(f"{path}: {len(run.details)} completions for {len(prompts)} prompts")
    return run


def concurrent(url: str, path: str, prompts: list[str], max_tokens: int) -> Run:
    """One single-prompt request per prompt, all in flight at once (threads released together)."""
    gate = threading.Barrier(len(prompts) + 1)

    def call(prompt: str) -> tuple[float, Run]:
        gate.wait()
        run = _post(url, path, {"prompts": [prompt], "max_tokens": max_tokens})
        return time.perf_counter(), run

    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        futures = [pool.submit(call, p) for p in prompts]
        gate.wait(timeout=60)
        started = time.perf_counter()
        results = [f.result() for f in futures]
    return Run(max(end for end, _ in results) - started, [d for _, run in results for d in run.details])


def sequential_basic(url: str, prompts: list[str], max_tokens: int) -> Run:
    """/basic_generate, one prompt after the other: the no-batching baseline."""
    runs = [_post(url, "/basic_generate", {"prompt": p, "max_tokens": max_tokens}) for p in prompts]
    return Run(sum(r.seconds for r in runs), [d for r in runs for d in r.details])


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


TTFT = {"static": ("/generate_stream", "/generate"), "vllm": ("/generate_vllm_stream", "/generate_vllm")}


def ttft(srv, engine: str, repeats: int) -> dict:
    """Seconds to a one-prompt stream's first token (median), alone and arriving while a round
    of four 20-token prompts runs: the static one waits for that round, vLLM's joins it."""
    stream_path, batch_path = TTFT[engine]
    first = lambda: timed_post(srv.url, stream_path, {"prompt": "The capital of France is"}, stream=True)[0]  # noqa: E731
    running = lambda h: (e := h["engines"][engine])["queued"] == 0 and e.get("inflight", e.get("running")) == 4  # noqa: E731

    def behind_a_round() -> float:
        body = {"prompts": [f"Tell me about topic {i}" for i in range(4)], "max_tokens": 20}
        worker = threading.Thread(target=timed_post, args=(srv.url, batch_path, body))
        worker.start()
        srv.wait_for(running, 60, f"four {engine} prompts running, not queued", every_s=0.01)
        seconds = first()
        worker.join()
        return seconds

    first()  # warm-up
    alone = statistics.median(first() for _ in range(repeats))
    return {"alone_s": alone, "behind_round_s": statistics.median(behind_a_round() for _ in range(repeats))}
