"""The probe port (deploy/probe.py, service/ops/beacon.py): a process of its own answers /health,
/livez and /metrics from what the worker last published, and says what it cannot know. These run
the real probe server on a real socket; the states come from a real Beacon (its clock a seam)."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests

from deploy.probe import HEALTH, LIVE_STALE_S, METRICS, STALE_S, spawn
from deploy.server import ROOT, free_port_run
from service.ops.beacon import Beacon

OK_BODY = {"status": "ok", "engines": {"static": {"status": "ready"}}}


@pytest.fixture
def probe(tmp_path):
    """(url, folder): a probe server answering from `folder`, as gunicorn's master starts one."""
    port = free_port_run()
    proc = spawn("127.0.0.1", port, tmp_path, cwd=ROOT)  # it listens already: requests wait in the backlog
    try:
        yield f"http://127.0.0.1:{port}", tmp_path
    finally:
        proc.terminate()
        proc.wait(10)


def published(folder, *, age_s: float = 0.0, body=None, code=200, metrics=b"up 1\n") -> Beacon:
    """A Beacon's one publication into `folder`, dated `age_s` ago."""
    beacon = Beacon(folder, HEALTH, METRICS, clock=lambda: time.time() - age_s)
    beacon.attach(lambda: (body or OK_BODY, code), lambda: metrics)
    beacon.publish()
    return beacon


def test_before_the_worker_publishes_it_says_starting_and_is_live(probe):
    url, _ = probe
    r = requests.get(f"{url}/health", timeout=10)
    assert r.status_code == 503 and r.json()["status"] == "starting", r.text
    assert requests.get(f"{url}/livez", timeout=10).status_code == 200  # a start is the startup probe's
    assert requests.get(f"{url}/metrics", timeout=10).status_code == 503
    r = requests.get(f"{url}/generate", timeout=10)
    assert r.status_code == 404 and "/health, /livez and /metrics" in r.json()["error"]


def test_a_connection_that_sends_nothing_is_closed_and_frees_its_thread(probe):
    """Threads are one per open connection: an idle one must not hold its thread for good."""
    url, _ = probe
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as idle:
        assert idle.recv(1) == b""  # the server closed it (a timeout here raises instead)
    assert requests.get(f"{url}/livez", timeout=10).status_code == 200  # and it still serves


def test_it_answers_what_the_worker_published_with_its_age(probe):
    url, folder = probe
    published(folder, body=OK_BODY, code=200, metrics=b"# TYPE up gauge\nup 1.0\n")
    r = requests.get(f"{url}/health", timeout=10)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "ok" and body["engines"] == OK_BODY["engines"]
    assert 0 <= body["published_s_ago"] < STALE_S
    r = requests.get(f"{url}/metrics", timeout=10)
    assert r.status_code == 200 and r.content == b"# TYPE up gauge\nup 1.0\n"
    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    # a 503 the worker decided (draining) is passed on as it is
    published(folder, body={"status": "draining", "engines": {}}, code=503)
    r = requests.get(f"{url}/health", timeout=10)
    assert r.status_code == 503 and r.json()["status"] == "draining"


def test_a_worker_that_stopped_publishing_is_unresponsive_then_not_live(probe):
    url, folder = probe
    published(folder, age_s=STALE_S + 5)
    r = requests.get(f"{url}/health", timeout=10)
    assert r.status_code == 503, r.text
    body = r.json()
    assert body["status"] == "unresponsive" and "published nothing" in body["error"]
    assert body["last"]["status"] == "ok"  # what it last said, for whoever debugs it
    assert requests.get(f"{url}/livez", timeout=10).status_code == 200  # not yet stuck for good
    published(folder, age_s=LIVE_STALE_S + 5)
    r = requests.get(f"{url}/livez", timeout=10)
    assert r.status_code == 503 and "published nothing" in r.text


def test_stale_metrics_are_a_503_like_health_and_fresh_ones_a_200_again(probe):
    """A frozen worker's last queue length must not steer an autoscaler or a router: /metrics
    turns 503 with /health, at the same age, and comes back when the worker publishes again."""
    url, folder = probe
    published(folder, age_s=STALE_S + 5, metrics=b"vllm:num_requests_waiting 7\n")
    assert requests.get(f"{url}/health", timeout=10).json()["status"] == "unresponsive"
    r = requests.get(f"{url}/metrics", timeout=10)
    assert r.status_code == 503 and "published no metrics" in r.text, r.text
    assert b"num_requests_waiting" not in r.content
    published(folder, age_s=STALE_S - 5, metrics=b"vllm:num_requests_waiting 7\n")  # old, not stale
    assert requests.get(f"{url}/metrics", timeout=10).status_code == 200
    published(folder, metrics=b"vllm:num_requests_waiting 0\n")  # the worker publishes again
    r = requests.get(f"{url}/metrics", timeout=10)
    assert r.status_code == 200 and r.content == b"vllm:num_requests_waiting 0\n"


def test_metrics_are_judged_by_when_they_were_written_not_by_the_state(probe):
    """A fresh worker that has not attached its app yet publishes "starting" beside the file a gone
    worker left; and a beacon whose metrics fail to render keeps its state fresh: neither vouches
    for the old numbers."""
    url, folder = probe
    published(folder, metrics=b"up 1\n")
    assert requests.get(f"{url}/metrics", timeout=10).status_code == 200
    Beacon(folder, HEALTH, METRICS).publish()  # a fresh worker's beacon, "starting"
    r = requests.get(f"{url}/metrics", timeout=10)
    assert r.status_code == 503 and "no metrics published yet" in r.text, r.text

    clock = [time.time() - STALE_S - 5]
    beacon = Beacon(folder, HEALTH, METRICS, clock=lambda: clock[0])
    rendered = []

    def metrics() -> bytes:  # renders once, then fails
        if rendered:
            raise RuntimeError("the registry is broken")
        rendered.append(1)
        return b"up 1\n"

    beacon.attach(lambda: (OK_BODY, 200), metrics)
    beacon.publish()
    clock[0] = time.time()  # now, and the metrics are due again
    with pytest.raises(RuntimeError):
        beacon.publish()
    assert requests.get(f"{url}/health", timeout=10).status_code == 200  # the state was written
    r = requests.get(f"{url}/metrics", timeout=10)
    assert r.status_code == 503 and "published no metrics" in r.text, r.text


def test_a_worker_whose_engine_failed_is_not_live(probe):
    """Its worker leaves (crash-only); one that still says so when the liveness probe comes is
    stuck in its leaving, and the container restarts. A drain is no failure."""
    url, folder = probe
    published(folder, body={"status": "draining", "engines": {"static": {"status": "ready"}}}, code=503)
    assert requests.get(f"{url}/livez", timeout=10).status_code == 200
    failed = {"status": "failed", "error": "InjectedFault: failpoint static.load injected a fault"}
    published(folder, body={"status": "failed", "engines": {"static": failed}}, code=503)
    r = requests.get(f"{url}/livez", timeout=10)
    assert r.status_code == 503 and "the static engine failed (InjectedFault" in r.text, r.text


def test_the_beacon_publishes_starting_then_the_attached_reply_at_once_when_kicked(tmp_path):
    beacon = Beacon(tmp_path, HEALTH, METRICS).start()
    try:
        state = _wait_state(tmp_path, lambda s: s is not None)
        assert state["code"] == 503 and state["body"]["status"] == "starting"
        beacon.attach(lambda: ({"status": "draining", "engines": {}}, 503), lambda: b"")
        state = _wait_state(tmp_path, lambda s: s["body"]["status"] == "draining")
        assert state["code"] == 503
    finally:
        beacon.stop()


def _wait_state(folder, done, timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            state = json.loads((folder / HEALTH).read_bytes())
        except FileNotFoundError:
            state = None
        if done(state):
            return state
        assert time.monotonic() < deadline, f"the beacon did not publish the state wanted: {state}"
        time.sleep(0.05)


def test_a_beacon_that_cannot_write_keeps_trying(tmp_path):
    folder = tmp_path / "not-yet"
    beacon = Beacon(folder, HEALTH, METRICS).start()  # every write fails: no folder
    try:
        assert beacon._thread.is_alive()
        folder.mkdir()
        assert _wait_state(folder, lambda s: s is not None)["body"]["status"] == "starting"
    finally:
        beacon.stop()


def test_the_probe_server_leaves_when_its_parent_is_gone(tmp_path):
    """A master killed with SIGKILL cannot stop its probe server; the probe server notices."""
    port = free_port_run()
    parent = subprocess.run(
        [sys.executable, "-c", _PARENT, str(port), str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert parent.returncode == 0, parent.stderr
    orphan = psutil.Process(int(parent.stdout.strip()))
    orphan.wait(timeout=30)  # raises psutil.TimeoutExpired if it stays
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/health", timeout=5)


_PARENT = """
import subprocess, sys
from deploy.probe import spawn
devnull = subprocess.DEVNULL  # not our stdout: the test reads it to its end
print(spawn("127.0.0.1", int(sys.argv[1]), sys.argv[2], stdout=devnull, stderr=devnull).pid)
"""


def test_gunicorn_does_not_start_when_the_probe_port_is_taken():
    """The master binds the probe port itself: taken, the start stops there with the reason (no
    worker loads a model behind a probe port that would never answer)."""
    port = free_port_run(2)
    with socket.create_server(("127.0.0.1", port + 1)):  # someone else's
        env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(port), "PROBE_PORT": str(port + 1)}
        gunicorn = str(Path(sys.executable).with_name("gunicorn"))
        command = [gunicorn, "-c", "gunicorn.conf.py", "wsgi:app"]
        run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr[-2000:]
    assert f"PROBE_PORT {port + 1}: " in run.stderr and "Address already in use" in run.stderr
    assert "Booting worker" not in run.stderr
