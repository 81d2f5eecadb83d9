"""What the soak watches while it runs: /health and /metrics timed once a second, each by a process
of its own (as a kubelet probes from outside), and the worker's RSS and threads."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from urllib.parse import urlsplit

import psutil
import requests

HEALTH_LIMIT_S = 1.0  # the probes' rule: each answered within this
# The probes' niceness where we may (root): a kubelet runs in the node's reserved share, not in a
# run queue with the hogs; what is timed is then the service's answer, not the prober's turn.
PROBER_NICE = -10


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
    to MAX_IN_FLIGHT client threads and timed their turns too (docs/performance.md#soak)."""
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
