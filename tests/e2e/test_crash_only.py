"""Crash-only under gunicorn (issue 41, point 2): an engine that fails takes its worker down, and
gunicorn's master starts a fresh one that serves; an engine that fails to load does the same, and
after a few failed starts in a row the master stops with the reason (deploy/starts.py). The
engine and the app in process: tests/integration/test_crash_only.py."""

from __future__ import annotations

import re
import subprocess

import pytest
import requests

from deploy.server import Server
from deploy.starts import EXIT_STATUS, LIMIT
from tests.helpers import wait_until
from tests.helpers.servers import serving


def test_under_gunicorn_the_worker_leaves_and_a_fresh_one_serves(tmp_path):
    env = {"VLLM_ENABLED": "0", "FAILPOINTS": "static.round=raise", "TORCH_THREADS": "1"}
    with serving(tmp_path, env, ready=("static",), disabled=("vllm",)) as server:
        mark = server.log_mark()
        died = requests.post(f"{server.url}/generate", json={"prompts": ["Hi"], "max_tokens": 2}, timeout=120)
        assert died.status_code == 503 and died.json()["type"] == "engine_failed", died.text
        wait_until(lambda: "this worker leaves" in server.log_text(mark), 60, "the worker to leave")
        wait_until(lambda: "Booting worker" in server.log_text(mark), 120, "a fresh worker")
        health = server.wait_for(lambda h: h.get("status") == "ok", 300, "the fresh worker ready")
        assert health["engines"]["static"]["status"] == "ready"
        pids = re.findall(r"Booting worker with pid: (\d+)", server.log_text())
        assert len(set(pids)) == 2, pids  # the first worker, then the fresh one


def test_an_engine_that_never_loads_stops_the_service_after_a_few_starts(tmp_path):
    """Each worker's load fails (the failpoint fires in every fresh process, before the model is
    read): the worker leaves, the master forks another, and after LIMIT in a row it exits with the
    reason instead of looping, for its supervisor's backoff to take over."""
    env = {"VLLM_ENABLED": "0", "FAILPOINTS": "static.load=raise", "TORCH_THREADS": "1"}
    with Server(tmp_path / "server.log", env) as server:
        try:
            code = server.proc.wait(300)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the master never stopped:\n{server.log_text()[-3000:]}")
        log = server.log_text()
        with pytest.raises(requests.ConnectionError):  # the probe server left with it: /livez fails
            requests.get(f"{server.probe_url}/livez", timeout=10)
    assert code == EXIT_STATUS, log[-3000:]
    booted = re.findall(r"Booting worker with pid: (\d+)", log)
    assert len(set(booted)) == LIMIT, log[-3000:]
    assert log.count("this worker leaves") == LIMIT and f"failed start {LIMIT} of {LIMIT} in a row" in log
    [reason] = [line for line in log.splitlines() if "Reason:" in line]
    assert f"the static engine failed to load {LIMIT} times in a row: InjectedFault: failpoint static.load" in reason
