"""`make serve` on a machine with no profile yet (deploy/first_profile.py): it answers with the
defaults before the profile is measured, measures it beside, then moves to a replica started with
the profile's choices, and no request sent through nginx meanwhile fails. Real nginx, supervisord,
gunicorn, profile and model; an empty PROFILE_DIR stands for the new machine, and a short budget
(PROFILE_BUDGET, PROFILE_FINISH=0: the knobs `make serve` passes) keeps the profile short."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from deploy.server import free_port_run
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
BODY = {"prompts": ["The capital of France is"], "max_tokens": 2}
AUTO = ("DTYPE", "STATIC_COMPILE", "VLLM_ENFORCE_EAGER")  # what the profile decides

pytestmark = pytest.mark.slow


def static_reason(url: str) -> str:
    return requests.get(f"{url}/health", timeout=10).json()["engines"]["static"]["settings"]["reason"]


def answered(url: str) -> bool:
    try:
        return requests.post(f"{url}/generate", json=BODY, timeout=60).status_code == 200
    except requests.RequestException:
        return False


@pytest.fixture
def served(tmp_path):
    if not (shutil.which("nginx") or Path("/usr/sbin/nginx").exists()):
        pytest.skip("nginx is not installed (`make setup` installs it when run as root)")
    port = free_port_run(5)  # nginx, two replicas, their probe servers
    env = {
        # the defaults: loopback, and every `auto` read from the profile (or its absence)
        **{k: v for k, v in os.environ.items() if k not in ("HOST", "REPLICA_HOST", "REPLICAS", *AUTO)},
        "PORT": str(port),
        "CLUSTER_DIR": str(tmp_path / "run"),
        "PROFILE_DIR": str(tmp_path / "profile"),  # empty: this machine has no profile yet
        "PROFILE_BUDGET": "20",
        "PROFILE_FINISH": "0",
        "VLLM_ENABLED": "0",  # two replicas at once fit this machine only without vLLM
        "REQUEST_TIMEOUT_S": "300",
    }
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "deploy.cluster", "serve"], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}", tmp_path, log_path, proc
    finally:
        proc.send_signal(signal.SIGTERM)  # supervisord: every program stops, the replicas drain
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def test_serve_answers_before_the_profile_then_switches_to_it_dropping_nothing(served):
    url, folder, log_path, proc = served
    log = lambda: log_path.read_text(errors="replace")  # noqa: E731
    wait_until(lambda: answered(url) or proc.poll() is not None, 600, "a first answer")
    assert proc.poll() is None, log()[-3000:]
    assert "serve: no profile for this machine yet" in log()
    assert static_reason(url).startswith("no profile"), static_reason(url)
    assert not list((folder / "profile").glob("*.json"))  # answered before any profile was stored

    statuses, stop = [], threading.Event()

    def traffic():  # one request at a time through nginx, across the switch
        while not stop.is_set():
            try:
                statuses.append(requests.post(f"{url}/generate", json=BODY, timeout=300).status_code)
            except requests.RequestException as exc:
                statuses.append(repr(exc))

    wait_until(lambda: "first-profile: profile stored" in log() or proc.poll() is not None, 900, "the profile")
    sender = threading.Thread(target=traffic)
    sender.start()
    try:
        wait_until(lambda: "first-profile: switched" in log() or "no switch" in log(), 600, "the switch")
        before = len(statuses)
        wait_until(lambda: len(statuses) >= before + 3, 120, "requests after the switch")
    finally:
        stop.set()
        sender.join(360)
    assert "first-profile: switched to the profile's choices" in log(), log()[-3000:]
    assert statuses and set(statuses) == {200}, statuses  # nothing dropped while replica2 took over
    assert list((folder / "profile").glob("*.json"))
    assert static_reason(url).startswith("profile "), static_reason(url)  # replica2 reads the profile
    port = int(url.rsplit(":", 1)[1])
    upstream = {line.split()[1]: line for line in (folder / "run" / "nginx.conf").read_text().splitlines()
                if line.strip().startswith("server 127.0.0.1:")}  # fmt: skip
    assert upstream[f"127.0.0.1:{port + 1}"].endswith(" down;")  # replica1 out of nginx (and stopped)
    assert not upstream[f"127.0.0.1:{port + 2}"].endswith(" down;")
