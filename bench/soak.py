"""The soak (`python -m bench --only soak`, never in the default run): open-loop Poisson arrivals at
LOAD_FACTOR x the capacity measured just before, a mix of every generate route of each ready engine,
streamed and not, two CPU-spinning processes for the middle third; then a quiet spell that sends one
ordinary request at a time until one is admitted. Every request sent is accounted for: answered 200,
refused with a reason (429/503/504), or lost (a connection error, a client timeout, a cut stream, any
other status). /health and /metrics are polled once a second throughout, on the probe server
(PROBE_PORT, deploy/probe.py) and on the worker itself, the worker's RSS and threads sampled. It
fails on a lost request, a refusal without its reason, a probe server's /health or /metrics (the
worker's own, without one) slower than 1 s, or no admission within the quiet spell."""

from __future__ import annotations

import multiprocessing
import threading
import time

import requests

from bench.soak_load import HOGS, LOAD_FACTOR, Load, as_clients, capacity, hog, quiet
from bench.soak_requests import ROUTES
from bench.soak_verdict import verdict
from bench.soak_watch import Watch


def run(url: str, cpu: str, seconds: float, max_tokens: int, timeout_s: float, probe_url: str | None = None) -> dict:
    """The whole soak against the service at `url`; its table, its counts and its verdict."""
    engines = requests.get(url + "/health", timeout=10).json()["engines"]
    status = {name: engines.get(name, {}).get("status") for name in ROUTES}
    mix = [route for name in ROUTES if status[name] == "ready" for route in ROUTES[name]]
    skipped = [f"{name} skipped: {s}" for name, s in status.items() if s != "ready"]
    if not mix:
        raise RuntimeError(f"soak: no engine ready ({status})")
    print(f"  soak: {len(mix)} routes; {'; '.join(skipped) or 'every engine ready'}", flush=True)
    fork = multiprocessing.get_context("fork")  # before any thread of ours starts; the hogs import nothing
    go, stop, third = fork.Event(), fork.Event(), seconds / 3
    hogs = [fork.Process(target=hog, args=(go, stop, third), daemon=True) for _ in range(HOGS)]
    for p in hogs:
        p.start()
    timer = threading.Timer(third, go.set)
    try:
        with Watch(url, probe_url, fork) as watch:
            before = watch.sample()
            burst = min(15.0, max(2.0, seconds / 6))
            rate = LOAD_FACTOR * as_clients(capacity, url, mix, max_tokens, burst, timeout_s)
            print(f"  soak: {rate / LOAD_FACTOR:.2f} req/s capacity; {rate:.2f} req/s for {seconds:.0f} s", flush=True)
            load = Load(url, max_tokens, timeout_s)
            watch.load_at = time.monotonic() - watch.started
            timer.start()
            as_clients(load.poisson, mix, rate, seconds)
            ended = time.monotonic()
            stop.set()
            recovery = quiet(url, mix[0][0], max_tokens, ended, timeout_s)
            load.drain(timeout_s + 10)
            after = watch.sample()
    finally:
        timer.cancel()
        stop.set()
        go.set()  # a hog still waiting for its turn wakes, sees `stop` and ends
        for p in hogs:
            p.join(10)
    return verdict(cpu, seconds, rate, skipped, load, recovery, watch, (before, after))
