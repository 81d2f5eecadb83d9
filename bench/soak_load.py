"""The soak's clients: the capacity measured in a closed loop, the open-loop Poisson arrivals at
LOAD_FACTOR x it, the CPU hogs beside them, and the quiet spell's one request at a time."""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from bench import measure
from bench.soak_requests import body, send

LOAD_FACTOR, HOGS, QUIET_S = 3, 2, 60.0  # x the capacity; CPU-spinning processes; the quiet spell's seconds
# The clients stand for users on other machines, but here their hundreds of threads share the
# service's cores and the kernel's run queue with the probes: unniced, the probe server (which
# reads one file) missed its second at the same instants as the worker's own /health. So the
# clients' threads run at this niceness; the probes, the hogs (noisy neighbours) and the service at 0.
CLIENT_NICE = 5
MAX_IN_FLIGHT = 1000  # the client's own bound: an arrival past it is not sent, and counted as such
BURST_CLIENTS = 16  # the closed loop that measures capacity: 4 static rounds, and vLLM a wide batch


def hog(go, stop, seconds: float) -> None:
    """Spin one core for `seconds` once `go` is set, or until `stop` is (then at once)."""
    if not go.wait(3600) or stop.is_set():
        return
    end = time.monotonic() + seconds
    while time.monotonic() < end and not stop.is_set():
        sum(range(10_000))


def capacity(url: str, mix: list[tuple[str, bool]], max_tokens: int, seconds: float, timeout_s: float) -> float:
    """Requests per second the service completes for the mix: BURST_CLIENTS in a closed loop."""
    for path, stream in mix:  # a warm-up, and a check that every route takes the soak's bodies
        outcome, text = send(url, path, stream, body(path, stream, "Hi", max_tokens), timeout_s)
        if outcome != "200":
            raise RuntimeError(f"soak: {path} (stream={stream}) answered {outcome}: {text}")
    end, done = time.monotonic() + seconds, Counter()

    def loop(i: int) -> None:
        for k in range(10_000):  # bounded in count too; the clock ends it long before
            if time.monotonic() > end:
                return
            path, stream = mix[(i + k) % len(mix)]
            prompt = f"Tell me about the number {i * 100 + k}."
            ok = send(url, path, stream, body(path, stream, prompt, max_tokens), timeout_s)[0] == "200"
            done[i] += ok
            time.sleep(0 if ok else 0.5)  # a refusal comes back at once: no hot loop of 429s

    started = time.monotonic()
    with ThreadPoolExecutor(BURST_CLIENTS) as pool:
        list(pool.map(loop, range(BURST_CLIENTS)))
    return max(sum(done.values()), 1) / (time.monotonic() - started)


class Load:
    """Open-loop arrivals: each request on a thread of its own, sent on schedule whatever the
    others are doing; every outcome counted once its answer (or its failure) is in."""

    def __init__(self, url: str, max_tokens: int, timeout_s: float):
        self.url, self.max_tokens, self.timeout_s = url, max_tokens, timeout_s
        self.sent, self.not_sent, self.threads, self.lock = 0, 0, [], threading.Lock()
        self.outcomes, self.examples, self.prompts = Counter(), {}, measure.make_prompts(64)

    def _one(self, path: str, stream: bool, prompt: str) -> None:
        outcome, text = send(self.url, path, stream, body(path, stream, prompt, self.max_tokens), self.timeout_s)
        with self.lock:
            self.outcomes[outcome] += 1
            self.examples.setdefault(outcome, text)

    def poisson(self, mix: list[tuple[str, bool]], rate: float, seconds: float) -> None:
        """Exponential gaps of mean 1/rate (seeded) for `seconds`; routes drawn from the mix."""
        rng, started = random.Random(0), time.monotonic()
        at = rng.expovariate(rate)
        while at < seconds:
            time.sleep(max(0.0, at - (time.monotonic() - started)))
            path, stream = rng.choice(mix)
            self.threads = [t for t in self.threads if t.is_alive()]
            if len(self.threads) >= MAX_IN_FLIGHT:
                self.not_sent += 1
            else:
                prompt = self.prompts[self.sent % len(self.prompts)]
                self.threads.append(threading.Thread(target=self._one, args=(path, stream, prompt), daemon=True))
                self.threads[-1].start()
                self.sent += 1
            at += rng.expovariate(rate)

    def drain(self, timeout_s: float) -> None:
        """Wait for every answer; a request still open after `timeout_s` is counted unanswered."""
        deadline = time.monotonic() + timeout_s
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with self.lock:
            self.outcomes["LOST: unanswered at the end"] += sum(t.is_alive() for t in self.threads)
            self.outcomes = +self.outcomes  # drops a zero count


def as_clients(fn, *args):
    """fn(*args) on a thread of its own at CLIENT_NICE, which the threads it starts inherit (Linux
    gives each thread its own niceness); its result."""
    out = []

    def run() -> None:
        os.setpriority(os.PRIO_PROCESS, 0, CLIENT_NICE)  # 0: this thread, on Linux
        out.append(fn(*args))

    thread = threading.Thread(target=run, name="clients")
    thread.start()
    thread.join()
    return out[0]


def quiet(url: str, path: str, max_tokens: int, ended: float, timeout_s: float) -> tuple[float | None, float, int]:
    """One ordinary request at a time until one is admitted: seconds from `ended` until the one
    admitted was sent (admission decides on arrival) and until it was answered; the tries."""
    tries = 0
    while (left := ended + QUIET_S - time.monotonic()) > 0:
        tries, sent = tries + 1, time.monotonic()
        outcome, _ = send(url, path, False, body(path, False, "Hi", max_tokens), min(timeout_s, max(left, 1.0)))
        if outcome == "200":
            return sent - ended, time.monotonic() - ended, tries
        time.sleep(0.5)
    return None, time.monotonic() - ended, tries
