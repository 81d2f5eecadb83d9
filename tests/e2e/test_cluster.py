"""`make cluster` (two replicas behind nginx, under supervisord) while `make rolling-restart` runs:
nothing is lost, nothing is crossed. Real make, nginx, supervisord, gunicorn and model; loopback only.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import requests

from deploy.render import NEXT_UPSTREAM_TRIES
from deploy.server import free_port_run
from tests.helpers import wait_until
from tests.helpers.traffic import MAX_TOKENS, PROMPTS, sse_events

ROOT = Path(__file__).resolve().parents[2]
THREADS, REPLICAS = 8, 2  # 8: enough that each replica holds work at its SIGTERM; more only lengthens drains
AFTER = 2 * THREADS  # requests sent once the rolling restart has ended: traffic before, during, after
BAD = [  # (body, status, type): answered by a replica through nginx, never retried
    ({"prompts": "not a list"}, 422, "invalid_request"),
    ({"prompts": ["ok"], "max_tokens": 0}, 422, "invalid_request"),
    (b"{not json", 400, "invalid_json"),
]

pytestmark = pytest.mark.slow


def healthy(url: str) -> bool:
    try:
        return requests.get(f"{url}/health", timeout=5).status_code == 200
    except requests.RequestException:
        return False


class Cluster:
    """`make cluster` in its own session; stopped with SIGTERM (as a user would), killed if stuck."""

    def __init__(self, run_dir: Path):
        self.port = free_port_run(2 * REPLICAS + 1)  # nginx, the replicas, their probe servers
        self.url = f"http://127.0.0.1:{self.port}"
        self.replica_urls = [f"http://127.0.0.1:{self.port + i}" for i in range(1, REPLICAS + 1)]
        self.run_dir = run_dir
        self.env = {
            **{k: v for k, v in os.environ.items() if k not in ("HOST", "REPLICA_HOST")},  # the defaults: loopback
            "PORT": str(self.port),
            "REPLICAS": str(REPLICAS),
            "CLUSTER_DIR": str(run_dir),
            "VLLM_ENABLED": "0",  # two replicas fit this machine only without vLLM
            "DTYPE": "float32",  # greedy completions the same in any batch: crossed answers show
            "TORCH_THREADS": "1",
            "THREADS": "32",
            "GRACEFUL_TIMEOUT": "300",  # a drain on a loaded 2-core machine (here: up to ~2 min) must not be cut short
            "REQUEST_TIMEOUT_S": "300",
        }
        self.log = open(run_dir / "make-cluster.log", "wb")
        self.proc = subprocess.Popen(
            ["make", "cluster"],
            cwd=ROOT,
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def ctl(self, *args: str) -> str:
        conf = self.run_dir / "supervisord.conf"
        out = subprocess.run(
            [shutil.which("supervisorctl") or str(ROOT / ".venv/bin/supervisorctl"), "-c", str(conf), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return out.stdout

    def pids(self) -> list[int]:
        return [int(p) for p in self.ctl("pid", "all").split() if p.isdigit() and int(p) > 0]

    def replica_log(self, i: int) -> str:
        path = self.run_dir / f"replica{i}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> int | None:
        children = self.pids() if self.proc.poll() is None else []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # make passes it on to supervisord: drain, stop
            try:
                self.proc.wait(180)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        for pid in children:  # supervisord gives each child its own process group
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.log.close()
        return self.proc.returncode


@pytest.fixture
def cluster(tmp_path):
    if not (shutil.which("nginx") or Path("/usr/sbin/nginx").exists()):
        pytest.skip("nginx is not installed (`make setup` installs it when run as root)")
    c = Cluster(tmp_path)
    try:
        wait_until(
            lambda: all(healthy(u) for u in [c.url, *c.replica_urls]) or c.proc.poll() is not None,
            600,
            "the cluster to be healthy",
        )
        assert c.proc.poll() is None, (tmp_path / "make-cluster.log").read_text()[-3000:]
        assert_rendered_safe(c)
        yield c
    finally:
        c.stop()


def assert_rendered_safe(c: Cluster) -> None:
    """`make cluster` with no HOST: nginx and every replica on loopback; nginx resends a request
    only when the replica did no work on it, once."""
    nginx, supervisord = (c.run_dir / "nginx.conf").read_text(), (c.run_dir / "supervisord.conf").read_text()
    assert f"listen 127.0.0.1:{c.port};" in nginx
    assert supervisord.count('HOST="127.0.0.1"') == REPLICAS
    assert "proxy_next_upstream error http_503 non_idempotent;" in nginx
    assert f"proxy_next_upstream_tries {NEXT_UPSTREAM_TRIES};" in nginx


def job(i: int) -> tuple[str, object, int | None]:
    """(kind, payload, prompt index or None): a mix of single and multi-prompt /generate, streams
    and, every 10th, a bad input (each of BAD by the 30th)."""
    if i % 10 == 9:
        return "bad", BAD[(i // 10) % len(BAD)], None
    if i % 4 == 3:
        return "stream", PROMPTS[i % len(PROMPTS)], i % len(PROMPTS)
    count = 1 + i % 3
    return "generate", [PROMPTS[(i + k) % len(PROMPTS)] for k in range(count)], None


REFUSED: list[tuple[int, str]] = []  # (job, the 429's message): the rolling restart's test wants none


def post(url: str, i: int) -> requests.Response:
    """Job i, as a client that honours a 429's Retry-After does (a few times). Each 429 is
    recorded: a replica that comes back starts from this machine's profile (batcher/profile/prior.py)
    and admits ordinary load at once, so there should be none; a client would still retry."""
    for _ in range(5):
        r = _post(url, i)
        if r.status_code != 429:
            return r
        REFUSED.append((i, r.text[:300]))
        time.sleep(int(r.headers["Retry-After"]))  # the service's own word on when to retry
    return r


def _post(url: str, i: int) -> requests.Response:
    kind, payload, _ = job(i)
    if kind == "bad":
        body, _, _ = payload
        kw = {"data": body, "headers": {"Content-Type": "application/json"}} if isinstance(body, bytes) else {}
        return requests.post(f"{url}/generate", json=None if kw else body, timeout=600, **kw)
    if kind == "stream":
        return requests.post(f"{url}/generate_stream", json={"prompt": payload, "max_tokens": MAX_TOKENS}, timeout=600)
    return requests.post(f"{url}/generate", json={"prompts": payload, "max_tokens": MAX_TOKENS}, timeout=600)


def test_a_rolling_restart_under_load_loses_and_crosses_nothing(cluster):
    def expected_texts(prompts: list[str], url: str) -> list[str]:
        """What each prompt completes to (greedy, float32: the same inside any batch, as the load's
        own batches must give), in one request, one round, straight to one replica."""
        r = requests.post(f"{url}/generate", json={"prompts": prompts, "max_tokens": MAX_TOKENS}, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()["generated_texts"]

    with ThreadPoolExecutor(REPLICAS) as pool:  # half the prompts each, a round of BATCH_SIZE (4)
        halves = [PROMPTS[k::REPLICAS] for k in range(REPLICAS)]
        texts = pool.map(expected_texts, halves, cluster.replica_urls)
        expected = {p: t for half, out in zip(halves, texts, strict=True) for p, t in zip(half, out, strict=True)}

    # The load is continuous: THREADS senders keep sending from before the rolling restart until
    # it has ended, then AFTER more, so the test lasts as long as the restart and each replica
    # holds work whenever it gets SIGTERM.
    lock = threading.Lock()
    sent, answered, after_left = 0, 0, AFTER
    load_running = threading.Event()  # THREADS answers seen (or a sender failed): start the restart
    rolling = threading.Event()
    restart_done = threading.Event()
    restart: dict = {}
    failures: list[BaseException] = []

    def next_job() -> tuple[int, str] | None:
        """The next request's number and phase, or None once AFTER have gone after the restart."""
        nonlocal sent, after_left
        with lock:
            if restart_done.is_set():
                if after_left == 0:
                    return None
                after_left -= 1
                phase = "after"
            else:
                phase = "during" if rolling.is_set() else "before"
            sent += 1
            return sent - 1, phase

    def sender() -> list[tuple[int, str, requests.Response]]:
        nonlocal answered
        replies = []
        try:
            while (picked := next_job()) is not None:
                i, phase = picked
                replies.append((i, phase, post(cluster.url, i)))
                with lock:
                    answered += 1
                    if answered >= THREADS:
                        load_running.set()
        except BaseException as e:
            failures.append(e)
            load_running.set()
            raise
        return replies

    def roll():
        try:
            assert load_running.wait(600)
            if failures:  # the load broke before the restart: nothing to restart under
                return
            rolling.set()
            started = time.monotonic()
            out = subprocess.run(
                ["make", "rolling-restart"],
                cwd=ROOT,
                env=cluster.env,
                capture_output=True,
                text=True,
                timeout=900,
            )
            restart.update(rc=out.returncode, output=out.stdout + out.stderr, seconds=time.monotonic() - started)
        finally:
            restart_done.set()

    roller = threading.Thread(target=roll)
    roller.start()
    with ThreadPoolExecutor(THREADS) as pool:
        senders = [pool.submit(sender) for _ in range(THREADS)]
        replies = sorted(r for f in senders for r in f.result())  # raises what a sender raised
    roller.join(900)

    phases = {phase: sum(p == phase for _, p, _ in replies) for phase in ("before", "during", "after")}
    assert phases["before"] >= THREADS and phases["during"] > 0 and phases["after"] == AFTER, phases
    assert [i for i, _, _ in replies] == list(range(sent)), "a request got no reply"
    assert restart.get("rc") == 0, restart.get("output")
    counts = {"generate": 0, "stream": 0, "bad": 0, "retried": 0}
    replicas_seen = set()
    for i, _, r in replies:
        kind, payload, prompt_index = job(i)
        counts[kind] += 1
        upstreams = [u.strip() for u in r.headers.get("X-Replica", "").split(",") if u.strip()]
        counts["retried"] += len(upstreams) > 1
        assert len(upstreams) <= NEXT_UPSTREAM_TRIES, (i, upstreams)  # resent once at most
        if kind == "bad":
            _, status, type_ = payload
            assert (r.status_code, r.json()["type"]) == (status, type_), (i, r.text)
            continue
        assert r.status_code == 200, (i, kind, r.status_code, r.text, upstreams)
        replicas_seen.add(upstreams[-1])
        if kind == "generate":
            assert r.json()["generated_texts"] == [expected[p] for p in payload], (i, payload, r.text)
        else:
            events = sse_events(r.text)
            assert events[-1].get("done") is True and events[-1]["finish_reason"] in ("length", "stop"), (i, r.text)
            assert "".join(e.get("token", "") for e in events) == expected[PROMPTS[prompt_index]], (i, r.text)
            assert len({e["sequence_id"] for e in events}) == 1
    assert replicas_seen == {u.removeprefix("http://") for u in cluster.replica_urls}, replicas_seen
    # ordinary load across a rolling restart is never refused: a fresh replica prices it from the
    # profile (before, 241 of 400 such requests were answered 429 "has not measured steps yet")
    assert not REFUSED, REFUSED
    assert sent >= 10 * len(BAD), sent  # job() sent each bad input

    drains = {}
    for i in range(1, REPLICAS + 1):
        lines = re.findall(
            r"static engine drained in [\d.]+s: (\d+) sequences finished, (\d+) abandoned", cluster.replica_log(i)
        )
        assert lines, f"replica{i} shows no drain:\n{cluster.replica_log(i)[-3000:]}"
        finished, abandoned = map(int, lines[0])
        assert abandoned == 0 and finished > 0, (i, lines)  # it held work at SIGTERM, and finished it all
        drains[f"replica{i}"] = finished
    print(f"\ncluster: {counts}, {phases}, drained sequences {drains}, rolling restart {restart['seconds']:.1f}s")
    print(restart["output"])
    cluster.stop()
    # every stop (two in the rolling restart, two at the end) was a drain that exited 0
    stopped = re.findall(
        r"stopped: (replica\d) \(exit status (\d+)\)", (cluster.run_dir / "supervisord.log").read_text()
    )
    assert sorted(stopped) == [("replica1", "0")] * 2 + [("replica2", "0")] * 2, stopped


def test_a_sigkill_of_supervisord_stops_everything_it_ran(cluster):
    """supervisord cannot pass on a SIGKILL, and gives each program its own process group: without
    the parent-death signal (deploy/render.py `orphan_guard`) nginx and the gunicorns, workers and
    batch runners included, served on as orphans."""
    supervisord = psutil.Process(int((cluster.run_dir / "supervisord.pid").read_text()))
    programs = supervisord.children(recursive=True)
    assert {p.name().split(":")[0] for p in programs} >= {"nginx", "gunicorn"}, programs  # "gunicorn: master"
    supervisord.kill()
    _, alive = psutil.wait_procs(programs, timeout=120)  # gunicorn drains an idle worker: seconds
    for p in alive:  # what the fixture's stop, through a dead supervisord, cannot reach
        p.kill()
    assert not alive, [(p.pid, p.name()) for p in alive]
    assert not any(healthy(url) for url in [cluster.url, *cluster.replica_urls])
