"""Overload (issue 41) on a real gunicorn with few THREADS, flooded over loopback: past the cap a
generate request is refused at once while /health and /metrics answer. The cap itself, through
Flask's test client: tests/integration/test_overload.py."""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from service.config import Config
from tests.helpers.servers import serving

THREADS = 16  # gunicorn's, for the flood: small, so that a bounded flood is past it


CLIENTS = 3 * THREADS  # concurrent senders, each one connection at a time


TRIES = 8  # requests a sender sends at most (a refused one waits Retry-After, then tries again)


PROBES = 20  # /health and /metrics, in turn, once every sender has sent


PROBE_TIMEOUT_S = 10  # the promise is a second; this only bounds a probe that never answers


FLOOD_TOKENS = 32  # a round of these holds its requests for seconds (one torch thread)


REFUSALS = {"too_busy", "queue_full", "wait_too_long"}  # 429s with a reason


def flood_request(i: int) -> tuple[str, dict]:
    """Every kind of prompt route in turn: demo and OpenAI, plain and streamed."""
    text = {"max_tokens": FLOOD_TOKENS, "ignore_eos": True}
    model = {"model": Config().model_name}
    return [
        ("/generate", {"prompts": [f"Story {i}"], **text}),
        ("/generate_stream", {"prompt": f"Story {i}", **text}),
        ("/static/v1/completions", {"prompt": f"Story {i}", **model, **text}),
        ("/static/v1/completions", {"prompt": f"Story {i}", "stream": True, **model, **text}),
        ("/static/v1/chat/completions", {"messages": [{"role": "user", "content": f"Story {i}"}], **model, **text}),
    ][i % 5]


def refusal_type(r: requests.Response) -> str | None:
    if r.status_code != 429:
        return None
    error = r.json()["error"]
    return error["code"] if isinstance(error, dict) else r.json()["type"]


def test_a_flood_past_threads_is_refused_at_once_while_the_probes_answer(tmp_path):
    env = {"VLLM_ENABLED": "0", "THREADS": str(THREADS), "TORCH_THREADS": "1", "REQUEST_TIMEOUT_S": "3600"}
    cap = Config(threads=THREADS).inflight_limit
    with serving(tmp_path, env, ready=("static",), disabled=("vllm",)) as srv:
        url, lock, stop, all_sent = srv.url, threading.Lock(), threading.Event(), threading.Event()
        for i in range(5):  # each route once, short: what a first request loads (the tokenizer, ...) is loaded
            path, body = flood_request(i)
            assert requests.post(f"{url}{path}", json={**body, "max_tokens": 2}, timeout=300).status_code == 200
        answers: list[tuple[float, int, str | None, str | None]] = []  # (answered at, status, 429 type, Retry-After)
        failures: list[str] = []
        first_sent = 0

        def sender(k: int) -> None:
            nonlocal first_sent
            for attempt in range(TRIES):
                if stop.is_set():
                    return
                path, body = flood_request(k * TRIES + attempt)
                if attempt == 0:
                    with lock:
                        first_sent += 1
                        if first_sent == CLIENTS:
                            all_sent.set()
                try:
                    r = requests.post(f"{url}{path}", json=body, timeout=(10, 300))
                except requests.RequestException as e:  # lost or hanging: the test fails on it
                    failures.append(f"{path}: {e!r}")
                    return
                with lock:
                    answers.append((time.monotonic(), r.status_code, refusal_type(r), r.headers.get("Retry-After")))
                if r.status_code == 429:
                    stop.wait(float(r.headers.get("Retry-After", 1)))  # as a polite client waits

        probes: list[tuple[str, float, int | str, int | None]] = []  # (path, seconds, status, static inflight)
        with ThreadPoolExecutor(CLIENTS) as pool:
            senders = [pool.submit(sender, k) for k in range(CLIENTS)]
            assert all_sent.wait(120), "the senders did not start"
            window = time.monotonic()
            # the worker's own probes, and the probe server's (deploy/probe.py), which answers
            # what the worker last published from a process of its own
            targets = [f"{base}{p}" for base in (url, srv.probe_url) for p in ("/health", "/metrics")]
            for i in range(PROBES):
                path = targets[i % len(targets)]
                started = time.monotonic()
                try:
                    r = requests.get(path, timeout=PROBE_TIMEOUT_S)
                    inflight = r.json()["engines"]["static"]["inflight"] if path.endswith("/health") else None
                    probes.append((path, time.monotonic() - started, r.status_code, inflight))
                except requests.RequestException as e:
                    probes.append((path, time.monotonic() - started, type(e).__name__, None))
                stop.wait(0.1)  # spread the probes over the flood
            window_end = time.monotonic()
            stop.set()
            for f in senders:
                f.result(timeout=600)

        seconds = sorted(s for _, s, _, _ in probes)
        print(
            f"\nflood: {len(answers)} answers ({sum(a[1] == 200 for a in answers)} 200,"
            f" {sum(a[1] == 429 for a in answers)} 429) from {CLIENTS} senders, THREADS {THREADS}, cap {cap};"
            f" {PROBES} probes: median {statistics.median(seconds) * 1000:.0f} ms,"
            f" max {seconds[-1] * 1000:.0f} ms, static inflight seen {[p[3] for p in probes if p[3] is not None]}"
        )
        print("probes (path, seconds, status, inflight):", [(p, round(t, 3), st, n) for p, t, st, n in probes])
        # every probe answered while the flood was past THREADS (a 503 would be a documented one);
        # the probe server's said what the worker is: ready, and busy (it saw work in flight)
        assert all(status in (200, 503) for _, _, status, _ in probes), probes
        from_probe_server = [(p, st, n) for p, _, st, n in probes if p.startswith(srv.probe_url)]
        assert from_probe_server and all(st == 200 for _, st, _ in from_probe_server), from_probe_server
        assert any(n for p, _, n in from_probe_server if p.endswith("/health")), from_probe_server
        # and the cap was full meanwhile: refusals came back inside the probes' window
        assert any(window <= at <= window_end and status == 429 for at, status, _, _ in answers), (window, answers)
        # every flood request answered: 200, or 429 with a reason and Retry-After; none lost
        assert not failures, failures
        for _, status, reason, retry_after in answers:
            assert status == 200 or (status == 429 and reason in REFUSALS and retry_after), (status, reason)

        # recovery: an ordinary request is admitted once the flood is over
        r = requests.post(
            f"{url}/generate", json={"prompts": ["The capital of France is"], "max_tokens": 2}, timeout=300
        )
        assert r.status_code == 200, r.text
