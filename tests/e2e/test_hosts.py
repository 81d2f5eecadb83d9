"""Replicas on two test hosts, nginx on a third, the API key on (deploy/hosts.py: network namespaces
on a veth bridge): a rolling restart across the hosts under load loses nothing and crosses
nothing. Real nginx, supervisord, gunicorn and model; the load comes from this machine's own
namespace, through nginx's address on its host. Needs root and iproute2; skips, saying why, without.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from deploy import cluster, hosts
from deploy.rolling_restart import healthy, rolling_restart
from deploy.settings import Settings
from deploy.tools import find_tool
from tests.helpers import wait_until
from tests.helpers.traffic import MAX_TOKENS, PROMPTS, sse_events

KEY = "hosts-key"
PORT = 8000  # each host has ports of its own: nginx on :8000 of its host, replica i on :8000+i of its
THREADS = 6  # senders: enough that a replica holds work when it drains
AFTER = 2 * THREADS  # requests sent once the rolling restart has ended
MAX_REQUESTS = 400  # bounds the load whatever the restart takes
HEALTH_TIMEOUT_S = 300

pytestmark = pytest.mark.slow


@dataclasses.dataclass
class HostsCluster:
    settings: Settings  # placed on the hosts (hosts.place)
    supervisord: subprocess.Popen

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.settings.port}"

    def replica_address(self, i: int) -> str:
        return f"{self.settings.replica_at(i)[1]}:{self.settings.port + i}"

    def ctl(self, *args: str) -> str:
        conf = str(self.settings.supervisord_conf)
        out = subprocess.run(
            [find_tool("supervisorctl"), "-c", conf, *args], capture_output=True, text=True, timeout=60
        )
        return out.stdout

    def pid(self, name: str) -> int:
        out = self.ctl("pid", name).strip()
        return int(out) if out.isdigit() else 0

    def log(self, name: str) -> str:
        path = self.settings.run_dir / name
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        """SIGTERM to supervisord (each replica drains), then SIGKILL to whatever is left: nothing
        may still run in a namespace when the namespaces go."""
        children = [self.pid(name) for name in ("nginx", "replicas:replica1", "replicas:replica2")]
        if self.supervisord.poll() is None:
            self.supervisord.send_signal(signal.SIGTERM)
            try:
                self.supervisord.wait(180)
            except subprocess.TimeoutExpired:
                os.killpg(self.supervisord.pid, signal.SIGKILL)
                self.supervisord.wait(30)
        for pid in filter(None, children):  # supervisord gives each child its own process group
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _settings(run_dir: Path) -> Settings:
    """cluster's settings from this environment, for two replicas; where each program runs comes
    from the placement (hosts.place)."""
    base = Settings.from_env()
    return dataclasses.replace(
        base,
        port=PORT,
        replicas=2,
        run_dir=run_dir,
        graceful_timeout_s=300,  # a drain on a loaded 2-core machine must not be cut short
        request_timeout_s=300,
        has_api_key=True,
    )


@pytest.fixture
def hosts_cluster(tmp_path):
    reason = hosts.unavailable()
    if reason:
        pytest.skip(reason)
    if find_tool("nginx") is None:
        pytest.skip("nginx is not installed (`make setup` installs it when run as root)")
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("HOST", "PORT", "REPLICA_HOST")},
        "API_KEY": KEY,
        "VLLM_ENABLED": "0",  # two replicas fit this machine only without vLLM
        "DTYPE": "float32",  # greedy completions the same in any batch: crossed answers show
        "STATIC_COMPILE": "0",
        "VLLM_ENFORCE_EAGER": "1",
        "TORCH_THREADS": "1",
        "THREADS": "32",
        "GRACEFUL_TIMEOUT": "300",
        "REQUEST_TIMEOUT_S": "300",
    }
    with hosts.network(["lb", "h1", "h2"]) as made:
        placement = {"nginx": made["lb"], "replica1": made["h1"], "replica2": made["h2"]}
        s = hosts.place(_settings(tmp_path), placement)
        with open(tmp_path / "supervisord.out", "ab") as out:  # the child keeps its own copy of the descriptor
            supervisord = subprocess.Popen(
                cluster.supervisord_command(s), env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        c = HostsCluster(s, supervisord)
        try:
            targets = [(made["lb"].address, PORT), (made["h1"].address, PORT + 1), (made["h2"].address, PORT + 2)]
            wait_until(
                lambda: all(healthy(*target) for target in targets) or c.supervisord.poll() is not None,
                HEALTH_TIMEOUT_S,
                "nginx and both replicas to be healthy on their hosts",
            )
            assert c.supervisord.poll() is None, c.log("supervisord.log")[-3000:]
            yield c
        finally:
            c.stop()


def auth(key: str = KEY) -> dict:
    return {"Authorization": f"Bearer {key}"}


def job(i: int) -> tuple[str, list[str] | str]:
    """Request i: every 4th a stream of one prompt, the rest /generate of 1-3 prompts."""
    if i % 4 == 3:
        return "stream", PROMPTS[i % len(PROMPTS)]
    return "generate", [PROMPTS[(i + k) % len(PROMPTS)] for k in range(1 + i % 3)]


def post(session: requests.Session, url: str, i: int) -> requests.Response:
    """Job i, as a client that honours a 429's Retry-After (a few times): a replica back cold
    admits only what it can run without a queue it cannot yet price."""
    kind, payload = job(i)
    path, body = ("/generate_stream", {"prompt": payload}) if kind == "stream" else ("/generate", {"prompts": payload})
    for _ in range(5):
        # a connection per request, as test_cluster's client: a reload of nginx (the rolling restart
        # does one per step) closes its idle keep-alive connections, and a POST sent on one as it
        # closes is lost with no way to tell it from one the server dropped (it once was, here)
        headers = {**auth(), "Connection": "close"}
        r = session.post(f"{url}{path}", json={**body, "max_tokens": MAX_TOKENS}, headers=headers, timeout=600)
        if r.status_code != 429:
            return r
        time.sleep(int(r.headers["Retry-After"]))
    return r


def completion(r: requests.Response, kind: str) -> list[str]:
    if kind == "generate":
        return r.json()["generated_texts"]
    events = sse_events(r.text)
    assert events[-1].get("done") is True, r.text
    return ["".join(e.get("token", "") for e in events)]


def expected_texts(c: HostsCluster) -> dict[str, str]:
    """Each prompt's completion (greedy, float32: the same in any batch), half the prompts straight
    to each replica on its host, one round each."""

    def ask(i: int) -> dict[str, str]:
        prompts = PROMPTS[i - 1 :: 2]
        r = requests.post(
            f"http://{c.replica_address(i)}/generate",
            json={"prompts": prompts, "max_tokens": MAX_TOKENS},
            headers=auth(),
            timeout=300,
        )
        assert r.status_code == 200, r.text
        return dict(zip(prompts, r.json()["generated_texts"], strict=True))

    with ThreadPoolExecutor(2) as pool:
        return {p: t for half in pool.map(ask, [1, 2]) for p, t in half.items()}


class Load:
    """THREADS senders through nginx from before the rolling restart until AFTER requests after
    it (MAX_REQUESTS at most), each reply kept with its number."""

    def __init__(self, url: str):
        self.url, self.lock = url, threading.Lock()
        self.sent, self.answered, self.after_left = 0, 0, AFTER
        self.running, self.restart_done = threading.Event(), threading.Event()

    def next_number(self) -> int | None:
        with self.lock:
            if self.sent >= MAX_REQUESTS or (self.restart_done.is_set() and self.after_left == 0):
                return None
            if self.restart_done.is_set():
                self.after_left -= 1
            self.sent += 1
            return self.sent - 1

    def sender(self) -> list[tuple[int, requests.Response]]:
        replies = []
        with requests.Session() as session:
            session.trust_env = False  # straight to the test host, never through a proxy
            try:
                while (i := self.next_number()) is not None:
                    replies.append((i, post(session, self.url, i)))
                    with self.lock:
                        self.answered += 1
                        if self.answered >= THREADS:
                            self.running.set()
            finally:
                self.running.set()  # a sender that fails lets the restart go on, and the test fail
        return replies


def test_a_rolling_restart_across_hosts_loses_nothing(hosts_cluster):
    c = hosts_cluster
    no_key = requests.post(f"{c.url}/generate", json={"prompts": ["Hi"], "max_tokens": 2}, timeout=60)
    wrong_key = requests.post(f"{c.url}/generate", json={"prompts": ["Hi"]}, headers=auth("wrong"), timeout=60)
    assert (no_key.status_code, wrong_key.status_code) == (401, 401), (no_key.text, wrong_key.text)
    expected = expected_texts(c)
    pids = {i: c.pid(f"replicas:replica{i}") for i in (1, 2)}

    load, restart = Load(c.url), {}

    def roll() -> None:
        try:
            assert load.running.wait(300)
            started = time.monotonic()
            restart["per_replica"] = rolling_restart(c.settings.run_dir, HEALTH_TIMEOUT_S)
            restart["seconds"] = time.monotonic() - started
        finally:
            load.restart_done.set()

    roller = threading.Thread(target=roll)
    roller.start()
    with ThreadPoolExecutor(THREADS) as pool:
        senders = [pool.submit(load.sender) for _ in range(THREADS)]
        replies = sorted((r for f in senders for r in f.result()), key=lambda pair: pair[0])
    roller.join(900)

    assert "per_replica" in restart, "the rolling restart did not finish"
    assert [i for i, _ in replies] == list(range(load.sent)), "a request got no reply"
    seen = set()
    for i, r in replies:
        kind, payload = job(i)
        assert r.status_code == 200, (i, kind, r.status_code, r.text, r.headers.get("X-Replica"))
        prompts = [payload] if kind == "stream" else payload
        assert completion(r, kind) == [expected[p] for p in prompts], (i, r.text)
        seen.add(r.headers["X-Replica"].split(",")[-1].strip())
    assert seen == {c.replica_address(i) for i in (1, 2)}, seen
    for i in (1, 2):  # restarted: a new process, healthy on its host, its drain exited 0
        assert c.pid(f"replicas:replica{i}") not in (0, pids[i]), (i, pids)
        assert healthy(c.settings.replica_at(i)[1], PORT + i)
        assert f"stopped: replica{i} (exit status 0)" in c.log("supervisord.log")
    drains = {
        i: re.findall(
            r"static engine drained in [\d.]+s: (\d+) sequences finished, (\d+) abandoned", c.log(f"replica{i}.log")
        )
        for i in (1, 2)
    }
    assert all(lines and lines[0][1] == "0" for lines in drains.values()), drains
    per_replica = ", ".join(f"{name} {s:.1f}s" for name, s in restart["per_replica"].items())
    print(
        f"\nhosts: {load.sent} requests through nginx on {c.settings.host}, lost 0, "
        f"{len(seen)} replicas served; rolling restart {restart['seconds']:.1f}s ({per_replica}, "
        f"out of nginx to back in); drained sequences (finished, abandoned) {drains}"
    )
