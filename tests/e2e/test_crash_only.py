"""Crash-only under gunicorn (issue 41, point 2): an engine that fails takes its worker down, and
gunicorn's master starts a fresh one that serves. The engine and the app in process:
tests/integration/test_crash_only.py."""

from __future__ import annotations

import re

import requests

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
