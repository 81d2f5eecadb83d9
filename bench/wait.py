"""The predicted wait, measured: one-prompt streams arriving as a Poisson process at about the
static engine's capacity and at twice it, per engine; each stream's predicted time to first
token (its `x-predicted-ttft` header) against the one measured here. Then, under twice the load,
the two admission policies: every request with a deadline (refused at once when it cannot be met)
against today's queue-then-wait (every request waits its turn; how many meet the same deadline)."""

from __future__ import annotations

import math
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from bench import measure

REQUESTS = 64
DEADLINE_ROUNDS = 3  # the deadline: this many of the static engine's measured rounds


def capacity(url: str, batch_size: int, max_tokens: int) -> tuple[float, float]:
    """(requests per second, seconds per round) of the static engine: one full round, timed."""
    body = {"prompts": measure.make_prompts(batch_size), "max_tokens": max_tokens, **measure.SAME_WORK}
    measure.timed_post(url, "/generate", body)  # warm: the engine measures itself too
    seconds, _ = measure.timed_post(url, "/generate", body)
    return batch_size / seconds, seconds


def warm(url: str, engine: str, batch_size: int, max_tokens: int) -> None:
    """Each engine's first requests are slower than the rest (vLLM's first steps here: many times
    a warm one), and its clocks keep them until outvoted: run a few at the widths the arrivals
    will make, as `capacity` does for the static engine, before measuring its predictions."""
    prompts = measure.make_prompts(batch_size)
    for width in range(1, batch_size + 1):
        body = {"prompts": prompts[:width], "max_tokens": max_tokens, **measure.SAME_WORK}
        measure.timed_post(url, measure.PATHS[engine], body)


def _one(url: str, path: str, body: dict, headers: dict) -> dict:
    """A stream: its status, the seconds to its first token, and the prediction it was given."""
    started = time.perf_counter()
    resp = requests.post(url + path, json=body, headers=headers, timeout=measure.TIMEOUT_S, stream=True)
    out = {
        "status": resp.status_code,
        "predicted_s": _seconds(resp.headers.get("x-predicted-ttft")),
        "answered_s": time.perf_counter() - started,  # its status line: a refusal's whole time
    }
    if resp.status_code == 200:
        lines = resp.iter_lines()  # one iterator: a second one would lose what the first buffered
        next(line for line in lines if line.startswith(b"data: "))
        out["ttft_s"] = time.perf_counter() - started
        for _ in lines:  # the rest of the stream: a client that hangs up cancels its row (and
            pass  # its round ends early, which is not the work the prediction was made for)
    resp.close()
    return out


def _seconds(value: str | None) -> float | None:
    return None if value in (None, "unknown") else float(value)


def poisson(url: str, engine: str, rate: float, max_tokens: int, deadline_ms: float | None, seed: int) -> list[dict]:
    """REQUESTS one-prompt streams, exponential gaps of mean 1/rate; each result in arrival order."""
    rng = random.Random(seed)
    gaps = [rng.expovariate(rate) for _ in range(REQUESTS)]
    path = measure.PATHS[engine] + "_stream"
    headers = {} if deadline_ms is None else {"X-Max-Queue-Ms": f"{deadline_ms:.0f}"}
    prompts = measure.make_prompts(REQUESTS)
    results: list[dict | None] = [None] * REQUESTS
    start = threading.Event()

    def arrive(i: int, at: float) -> None:
        start.wait()
        time.sleep(max(0.0, at - (time.perf_counter() - t0)))  # the arrival process itself
        body = {"prompt": prompts[i], "max_tokens": max_tokens, **measure.SAME_WORK}
        results[i] = _one(url, path, body, headers)

    arrivals, at = [], 0.0
    for gap in gaps:
        at += gap
        arrivals.append(at)
    with ThreadPoolExecutor(REQUESTS) as pool:
        futures = [pool.submit(arrive, i, a) for i, a in enumerate(arrivals)]
        t0 = time.perf_counter()
        start.set()
        for f in futures:
            f.result()
    return results


def _ratio_row(engine: str, load: str, rate: float, results: list[dict]) -> dict:
    errors = [
        abs(r["predicted_s"] - r["ttft_s"]) / r["ttft_s"]
        for r in results
        if r.get("ttft_s") and r.get("predicted_s") is not None
    ]
    ttft = sorted(r["ttft_s"] for r in results if r.get("ttft_s"))
    return {
        "engine": engine,
        "load": load,
        "arrivals (req/s)": round(rate, 2),
        "answered": len(ttft),
        "predicted": len(errors),
        "TTFT p50 (ms)": round(1000 * statistics.median(ttft)) if ttft else None,
        "TTFT p90 (ms)": round(1000 * _p90(ttft)) if ttft else None,
        "error p50": round(statistics.median(errors), 3) if errors else None,
        "error p90": round(_p90(sorted(errors)), 3) if errors else None,
    }


def _p90(values: list[float]) -> float:
    return values[math.ceil(0.9 * len(values)) - 1]  # nearest rank


def _policy_row(engine: str, policy: str, deadline_ms: float, results: list[dict]) -> dict:
    refused = sum(r["status"] == 429 for r in results)
    admitted = [r for r in results if r["status"] == 200]
    met = sum(r["ttft_s"] * 1000 <= deadline_ms for r in admitted)
    waited = sorted(r["ttft_s"] for r in admitted)
    refusals = sorted(r["answered_s"] for r in results if r["status"] == 429)
    return {
        "engine": engine,
        "policy": policy,
        "deadline (ms)": round(deadline_ms),
        "refused at once": refused,
        "admitted": len(admitted),
        "admitted that met it": met,
        "met (%)": round(100 * met / len(admitted)) if admitted else None,
        "other errors": len(results) - refused - len(admitted),
        "TTFT p90 of admitted (ms)": round(1000 * _p90(waited)) if waited else None,
        "429 in, p90 (ms)": round(1000 * _p90(refusals)) if refusals else None,
    }


def run(url: str, engines: list[str], batch_size: int, max_tokens: int) -> dict:
    """Both tables: the prediction's error per engine and load, and the policies under 2x."""
    rate, round_s = capacity(url, batch_size, max_tokens)
    deadline_ms = DEADLINE_ROUNDS * round_s * 1000
    accuracy, policies = [], []
    for engine in engines:
        warm(url, engine, batch_size, max_tokens)
        for load, factor in (("1x", 1.0), ("2x", 2.0)):
            results = poisson(url, engine, factor * rate, max_tokens, None, seed=1)
            accuracy.append(_ratio_row(engine, load, factor * rate, results))
            print(f"  {accuracy[-1]}", flush=True)
            if factor == 2.0:
                policies.append(_policy_row(engine, "queue, no deadline", deadline_ms, results))
                with_deadline = poisson(url, engine, factor * rate, max_tokens, deadline_ms, seed=1)
                policies.append(_policy_row(engine, "X-Max-Queue-Ms", deadline_ms, with_deadline))
                print(f"  {policies[-2]}\n  {policies[-1]}", flush=True)
    return {"wait_accuracy": accuracy, "wait_policies": policies, "static_round_s": round(round_s, 3)}
