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

import json
import multiprocessing
import os
import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import requests

from bench import measure

LOAD_FACTOR, HOGS, QUIET_S, HEALTH_LIMIT_S = 3, 2, 60.0, 1.0
# The clients stand for users on other machines, but here their hundreds of threads share the
# service's 2 cores and the kernel's run queue with the probes: unniced, the probe server (which
# reads one file) missed its second at the same instants as the worker's own /health. So the
# clients' threads run at this niceness; the probes, the hogs (noisy neighbours) and the service at 0.
CLIENT_NICE = 5
# The probes' niceness where we may (root): a kubelet runs in the node's reserved share, not in a
# run queue with the hogs; what is timed is then the service's answer, not the prober's turn.
PROBER_NICE = -10
MAX_IN_FLIGHT = 1000  # the client's own bound: an arrival past it is not sent, and counted as such
BURST_CLIENTS = 16  # the closed loop that measures capacity: 4 static rounds, and vLLM a wide batch
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile")  # what decides the machine profile
CHAT = "/chat/completions"
ROUTES = {  # engine -> (path, stream) for each route of the mix
    "vllm": [("/generate_vllm", False), ("/generate_vllm_stream", True), ("/v1/completions", False),
             ("/v1/completions", True), ("/v1" + CHAT, False), ("/v1" + CHAT, True)],
    "static": [("/generate", False), ("/generate_stream", True), ("/static/v1/completions", False),
               ("/static/v1/completions", True), ("/static/v1" + CHAT, False), ("/static/v1" + CHAT, True)],
}  # fmt: skip


def body(path: str, stream: bool, prompt: str, max_tokens: int) -> dict:
    """The soak's one request shape: one short prompt, exactly `max_tokens` tokens."""
    same = {"max_tokens": max_tokens, **measure.SAME_WORK}
    if path.endswith(CHAT):
        return {"messages": [{"role": "user", "content": prompt}], "stream": stream, **same}
    if "/v1/" in path:
        return {"prompt": prompt, "stream": stream, **same}
    return {"prompt": prompt, **same} if stream else {"prompts": [prompt], **same}


def reason(payload: object) -> tuple[str, str] | None:
    """(code, message) of an error body in either shape the service writes, None without one."""
    err = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(err, dict):  # OpenAI's: our own type is its "code"
        code, text = err.get("code") or err.get("type"), err.get("message")
    else:  # the demo routes': {"error": message, "type": code}
        code, text = payload.get("type") if isinstance(err, str) else None, err
    return (str(code), str(text)) if code and text else None


def _stream(resp: requests.Response, deadline: float) -> tuple[str, str]:
    """A 200 stream read to its end: ("200", "") or the error event it carried instead."""
    for line in resp.iter_lines():
        if time.monotonic() > deadline:  # requests' timeout is per read; a trickle never trips it
            return "LOST: client timeout", "stream still going"
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            return "200", ""
        event = json.loads(data)
        if "error" in event:
            why = reason(event)
            return (f"200, then {why[0]} in the stream", why[1]) if why else ("FAIL: stream error, no reason", "")
        if event.get("done"):
            return "200", ""
    return "LOST: stream cut", "no final event"


def send(url: str, path: str, stream: bool, payload: dict, timeout_s: float) -> tuple[str, str]:
    """One request: its outcome (a key of the table) and an example message."""
    try:
        with requests.post(url + path, json=payload, timeout=timeout_s, stream=stream) as resp:
            if resp.status_code == 200:
                return _stream(resp, time.monotonic() + timeout_s) if stream else ("200", "")
            if resp.status_code not in (429, 503, 504):
                return f"LOST: {resp.status_code}", resp.text[:200]
            try:
                why = reason(resp.json())
            except ValueError:  # a proxy's HTML page, say
                why = None
            if why is None:
                return f"FAIL: {resp.status_code} without a reason", resp.text[:200]
            if resp.status_code != 504 and not resp.headers.get("Retry-After"):
                return f"FAIL: {resp.status_code} {why[0]} without Retry-After", why[1]
            return f"{resp.status_code} {why[0]}", why[1]
    except requests.Timeout:
        return "LOST: client timeout", f"no answer in {timeout_s:.0f} s"
    except (requests.RequestException, ValueError) as exc:  # refused, reset, a body cut mid-read
        return "LOST: connection error", f"{type(exc).__name__}: {str(exc)[:150]}"


def worker(port: int) -> psutil.Process | None:
    """The gunicorn worker listening on `port`, or on port + 1 (`make serve`: nginx on PORT,
    the replica on PORT + 1): the listener whose parent listens there too (the master)."""
    for p in (port, port + 1):
        found = {}
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if any("gunicorn" in arg for arg in proc.info["cmdline"] or []) and any(
                    c.status == psutil.CONN_LISTEN and c.laddr.port == p for c in proc.net_connections("tcp")
                ):
                    found[proc.pid] = proc
            except psutil.Error:
                continue
        workers = [proc for proc in found.values() if proc.ppid() in found]
        if workers:
            return workers[0]
    return None


def probe(label: str, url: str, stop, out) -> None:
    """Once a second until `stop`: `url` timed, (label, seconds, status) into `out`. In a process
    of its own, as a kubelet probes from outside: in the load's process it shared one GIL with up
    to MAX_IN_FLIGHT client threads and timed their turns too (a 3.1 s /health once, here)."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, PROBER_NICE)
    except PermissionError:
        pass
    while not stop.wait(1.0):
        started = time.monotonic()
        try:
            status = requests.get(url, timeout=10).status_code
            took = time.monotonic() - started
        except requests.RequestException:
            status, took = 0, float("inf")
        out.put((label, took, status, started))


def targets(url: str, probe_url: str | None) -> tuple[dict[str, str], set[str]]:
    """What to poll ({label: URL}) and which of them the 1 s rule holds: the probe server's
    /health and /metrics where there is one (what a kubelet and Prometheus are pointed at), the
    worker's own otherwise; the worker's are polled and shown either way."""
    polled = {f"worker {p}": url + p for p in ("/health", "/metrics")}
    if probe_url is None:
        return polled, set(polled)
    probes = {f"probe server {p}": probe_url + p for p in ("/health", "/metrics")}
    return {**probes, **polled}, set(probes)


class Watch:
    """Once a second until stopped: /health and /metrics timed (each by a process of its own,
    `probe`), the worker's RSS and threads. `fork`: the multiprocessing context to start the
    probes with, before any thread of ours runs."""

    def __init__(self, url: str, probe_url: str | None, fork):
        self.url, self.stop, self.proc = url, threading.Event(), worker(urlsplit(url).port or 80)
        polled, self.ruled = targets(url, probe_url)
        self.latency, self.samples, self.pids = dict.fromkeys(polled, 0.0), [], set()
        self.polls, self.missed, self.not_ok = Counter(), Counter(), Counter()  # missed: not within the limit
        self.late: dict[str, list[float]] = {label: [] for label in polled}  # when each missed poll was sent
        self.started, self.steal = time.monotonic(), psutil.cpu_times().steal  # the hypervisor's share, from here
        self.load_at = 0.0  # seconds into the watch when the load began (`run` sets it)
        self.stolen: list[tuple[float, float, float]] = []  # (from, to, CPU-s stolen), each second
        self.probes_stop, self.results = fork.Event(), fork.SimpleQueue()
        self.probes = [
            fork.Process(target=probe, args=(label, target, self.probes_stop, self.results), daemon=True)
            for label, target in polled.items()
        ]
        self.threads = [threading.Thread(target=self._sample, daemon=True)]

    def sample(self) -> tuple[float, int] | None:
        """(RSS in MiB, threads) of the worker now, found again if it was replaced."""
        try:
            if self.proc is None or not self.proc.is_running():
                self.proc = worker(urlsplit(self.url).port or 80)
            if self.proc is None:
                return None
            self.pids.add(self.proc.pid)
            return self.proc.memory_info().rss / 2**20, self.proc.num_threads()
        except psutil.Error:
            return None

    def _sample(self) -> None:
        last = (time.monotonic(), psutil.cpu_times().steal)
        while not self.stop.wait(1.0):
            if now := self.sample():
                self.samples.append(now)
            at, steal = time.monotonic(), psutil.cpu_times().steal
            self.stolen.append((last[0] - self.started, at - self.started, steal - last[1]))
            last = (at, steal)

    def steal_near(self, sent: float) -> float:
        """CPU-seconds the hypervisor took in the samples that overlap [sent - 1, sent + 2]."""
        return sum(s for a, b, s in self.stolen if a < sent + 2 and b > sent - 1)

    def _count(self) -> None:
        """The probes' results, gathered once they have stopped."""
        while not self.results.empty():
            path, took, status, sent = self.results.get()
            self.latency[path], self.polls[path] = max(self.latency[path], min(took, 10.0)), self.polls[path] + 1
            self.missed[path] += took > HEALTH_LIMIT_S
            if took > HEALTH_LIMIT_S:
                self.late[path].append(sent - self.started)
            self.not_ok[path] += status != 200

    def __enter__(self) -> Watch:
        for p in self.probes:
            p.start()
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.steal = psutil.cpu_times().steal - self.steal
        self.stop.set()
        self.probes_stop.set()
        for p in self.probes:
            p.join(15)
        for t in self.threads:
            t.join(15)
        self._count()


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


def failures(load: Load, recovery: tuple, watch: Watch) -> list[str]:
    """Why the soak failed: each line one of the four rules of the module's docstring broken."""
    lost = sum(n for k, n in load.outcomes.items() if k.startswith("LOST"))
    bare = sum(n for k, n in load.outcomes.items() if k.startswith("FAIL"))
    out = [f"{lost} of {load.sent} requests lost or unanswered"] if lost else []
    out += [f"{bare} refusals without a reason or Retry-After"] if bare else []
    for label in sorted(watch.ruled):
        if watch.missed[label] or watch.latency[label] > HEALTH_LIMIT_S:
            out.append(
                f"{label} did not answer within {HEALTH_LIMIT_S:g} s in {watch.missed[label]} of "
                f"{watch.polls[label]} polls (max {watch.latency[label]:.2f} s)"
            )
    if recovery[0] is None:
        out.append(f"no ordinary request admitted within the {QUIET_S:g} s quiet spell ({recovery[2]} tried)")
    return out


def cpu_detail() -> str:
    """What the model name leaves out ("AMD EPYC" names a Zen 3 and a Zen 4 alike): family, model, vector flags."""
    info = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().splitlines() if ":" in line)
    info = {k.strip(): v.strip() for k, v in info.items()}
    flags = [f for f in FLAGS if f in info.get("flags", "").split()]
    return f"{psutil.cpu_count()} cores; family {info.get('cpu family')}, model {info.get('model')}; {' '.join(flags)}"


def _at(watch: Watch, seconds: list[float]) -> str:
    """When the late polls were sent, seconds into the watch, and the CPU time the hypervisor
    took around each: " (sent at 63 s: steal 0.9 CPU-s)", or ""."""
    late = [f"{s:.0f} s: steal {watch.steal_near(s):.1f} CPU-s" for s in seconds]
    return f" (sent at {'; '.join(late)})" if late else ""


def _trio(values: tuple, fmt: str) -> str:
    return " / ".join("-" if v is None else fmt.format(v) for v in values)


def verdict(cpu: str, seconds: float, rate: float, skipped: list[str], load: Load, recovery: tuple, watch, ends):
    """The table's rows, the counts the smoke test checks, and the failures, if any."""
    why = failures(load, recovery, watch)
    admitted, answered, tries = recovery
    before, after = (e or (None, None) for e in ends)
    peak = [max((s[i] for s in watch.samples), default=None) for i in (0, 1)]
    rows = [
        ("CPU", cpu, f"{cpu_detail()}; steal {watch.steal:.1f} CPU-s over the soak (the hypervisor's)"),
        ("offered (req/s)", round(rate, 2), f"Poisson, {LOAD_FACTOR}x the capacity measured just before"),
        ("load (s)", round(seconds), "; ".join([f"from {watch.load_at:.0f} s into the watch",
                                                 f"{HOGS} CPU-spinning processes for its middle third", *skipped])),
        ("requests sent", load.sent, f"{sum(load.outcomes.values())} accounted for"),
        *((k, n, load.examples.get(k, "")[:90]) for k, n in sorted(load.outcomes.items())),
        *([("not sent: client at its cap", load.not_sent, f"{MAX_IN_FLIGHT} in flight")] if load.not_sent else []),
        ("recovery (s)", "-" if admitted is None else round(admitted, 1),
         f"{tries} tries, one at a time; the admitted one answered at {answered:.1f} s"),
        ("worker RSS (MiB) before / peak / after", _trio((before[0], peak[0], after[0]), "{:.0f}"),
         f"worker pids seen: {len(watch.pids)}"),
        ("worker threads before / peak / after", _trio((before[1], peak[1], after[1]), "{:d}"), ""),
        *((f"{p} max latency (ms)", round(1000 * s), f"{watch.polls[p]} polls, 1/s: {watch.missed[p]} over "
           f"{HEALTH_LIMIT_S:g} s or unanswered{_at(watch, watch.late[p])}, {watch.not_ok[p]} not 200"
           f"{'' if p in watch.ruled else '; shown, not ruled'}")
          for p, s in watch.latency.items()),
        ("verdict", "FAIL" if why else "PASS", "; ".join(why)),
    ]  # fmt: skip
    return {
        "soak": [{"what": w, "value": v, "detail": str(d).replace("\n", " ")} for w, v, d in rows],
        "soak_counts": {"sent": load.sent, "outcomes": dict(load.outcomes), "not_sent": load.not_sent},
        "soak_failures": why,
        "soak_verdict": "FAIL" if why else "PASS",
    }
