"""Timed HTTP calls against the service: the one timing helper, the grid's three methods, a
request kept running while something else is timed, and the time to first token."""

import contextlib
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import requests

# Every prompt generates exactly max_tokens on every path (as vLLM's own benchmarks do), so that
# a prompt the model happens to end early does not make one path look faster than another.
SAME_WORK = {"ignore_eos": True}
TIMEOUT_S = 600
PATHS = {"static": "/generate", "vllm": "/generate_vllm"}  # their streams: the same + "_stream"
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
    details: list[dict]  # per prompt, in order: round, queue_ms, inference_ms, tokens, ...

    @property
    def rounds(self) -> int:  # distinct `round` values in the details (vLLM: admission steps)
        return len({d["round"] for d in self.details})


def post(url: str, path: str, body: dict) -> Run:
    seconds, resp = timed_post(url, path, {**body, "details": True})
    return Run(seconds, resp.json()["details"])


def wave(url: str, path: str, bodies: list[dict]) -> Run:
    """One request per body, all in flight at once (threads released together); seconds until the
    last answer, and the details in the bodies' order."""
    gate = threading.Barrier(len(bodies) + 1)

    def call(body: dict) -> tuple[float, Run]:
        gate.wait()
        run = post(url, path, body)
        return time.perf_counter(), run

    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        futures = [pool.submit(call, body) for body in bodies]
        gate.wait(timeout=60)
        started = time.perf_counter()
        results = [f.result() for f in futures]
    return Run(max(end for end, _ in results) - started, [d for _, run in results for d in run.details])


def grid_run(url: str, engine: str, method: str, prompts: list[str], max_tokens: int) -> Run:
    """One measurement of the grid: "one" request carrying every prompt, "concurrent" single-prompt
    requests all in flight at once, or ("basic") /basic_generate calls one after the other."""
    same = {"max_tokens": max_tokens, **SAME_WORK}
    if method == "one":
        return post(url, PATHS[engine], {"prompts": prompts, **same})
    if method == "concurrent":
        return wave(url, PATHS[engine], [{"prompts": [p], **same} for p in prompts])
    runs = [post(url, "/basic_generate", {"prompt": p, **same}) for p in prompts]
    return Run(sum(r.seconds for r in runs), [d for r in runs for d in r.details])


def cell(engine: str, method: str, n: int, repeats: int, fn: Callable[[], Run]) -> dict:
    """Repeat one measurement; the cell's median and spread (min-max) over the repeats."""
    runs = [fn() for _ in range(repeats)]
    seconds = [r.seconds for r in runs]
    out = dict(path=engine, method=method, n=n, repeats=repeats, runs=seconds, median=statistics.median(seconds))
    out.update(min=min(seconds), max=max(seconds), rounds=[r.rounds for r in runs])
    print(f"  N={n:<3} {engine:>6} {method:<10} {out['median']:8.3f} s (of {len(runs)})", flush=True)
    return out


@contextlib.contextmanager
def while_running(srv, engine: str, prompts: list[str], max_tokens: int):
    """A request of `prompts` running on `engine`, none of them still queued, during the `with`."""
    body = {"prompts": prompts, "max_tokens": max_tokens, **SAME_WORK}
    worker = threading.Thread(target=timed_post, args=(srv.url, PATHS[engine], body))
    worker.start()
    try:
        running = lambda h: h.get("engines", {}).get(engine, {}).get("running") == len(prompts)  # noqa: E731
        srv.wait_for(running, 60, f"{len(prompts)} {engine} prompts running", every_s=0.01)
        yield
    finally:
        worker.join()


def ttft(srv, engine: str, repeats: int) -> dict:
    """Milliseconds to a one-prompt stream's first token (median), alone and arriving while a
    round of four 20-token prompts runs: the static one waits for that round, vLLM's joins it."""
    stream = PATHS[engine] + "_stream"
    first = lambda: timed_post(srv.url, stream, {"prompt": "The capital of France is"}, stream=True)[0]  # noqa: E731

    def behind_a_round() -> float:
        with while_running(srv, engine, [f"Tell me about topic {i}" for i in range(4)], 20):
            return first()

    first()  # warm-up
    alone, behind = (round(1000 * statistics.median(fn() for _ in range(repeats))) for fn in (first, behind_a_round))
    return {"engine": engine, "alone (ms)": alone, "behind a running round of 4 (ms)": behind}
