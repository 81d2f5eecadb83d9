"""Crash-only engines (issue 41, point 2): an engine thread that dies, or that holds work and makes
no progress, is failed for good: what it holds is answered 503 at once, new work is refused 503
naming the error, /health turns 503 "failed", a drain ends at once, and under gunicorn the worker
leaves and a fresh one starts. An engine whose load raises is failed the same way, and how each
start ended is reported for gunicorn's master to count (deploy/starts.py). Faults go in through
the failpoints the engines offer (batcher/failpoints.py), never by editing the code."""

from __future__ import annotations

import dataclasses
import os
import threading

import pytest

from batcher import failpoints
from batcher.errors import EngineDied, NotReady
from batcher.sampling import SamplingParams
from batcher.sequence import Sequence
from deploy.starts import FailedStarts
from service import begin_shutdown, create_app, shutdown
from service.config import Config
from service.http.state import app_state
from service.ops.health import engine_health
from tests.helpers import wait_until


@pytest.fixture(autouse=True)
def disarmed():
    yield
    failpoints.disarm()


def sequences(count: int) -> list[Sequence]:
    return [Sequence(f"Count to {i}", SamplingParams(max_tokens=4)) for i in range(count)]


@pytest.fixture
def engine(runner_fp32, request):
    """A real static engine on the session's runner; `stall_s` from the test's parameter."""
    from batcher.static.worker import StaticWorker

    settings = dataclasses.replace(runner_fp32.settings, stall_s=getattr(request, "param", 300.0))
    worker = StaticWorker(settings, load_runner=lambda: runner_fp32).start()
    deaths: list[tuple[str, str]] = []
    dead = threading.Event()  # set by the death callback, which runs after the 503s went out
    worker.when_dead(lambda name, error: (deaths.append((name, error)), dead.set()))
    assert worker.wait_ready(60)
    yield worker, deaths, dead
    failpoints.disarm()  # a thread hanging at its failpoint goes on, and is joined
    worker.stop()


def test_an_engine_thread_that_raises_fails_everything_it_holds_at_once_and_refuses_new_work(engine):
    worker, deaths, dead = engine
    failpoints.arm("static.round", "raise")
    held = sequences(6)  # a round of four taken, two queued behind it
    worker.submit(held)
    for seq in held:
        assert seq.done.wait(60), "a sequence of a dead engine was never answered"
        assert isinstance(seq.error, EngineDied) and "InjectedFault" in str(seq.error)
    assert dead.wait(60) and worker.status == "failed" and worker.lifecycle.died and worker.inflight() == 0
    assert deaths == [("static", worker.error)] and "the engine thread died" in worker.error
    with pytest.raises(NotReady, match="failed"):
        worker.submit(sequences(1))
    worker.begin_drain()
    assert worker.wait_drained(0)  # a drain with a dead engine ends at once


@pytest.mark.parametrize("engine", [0.5], indirect=True)
def test_an_engine_that_holds_work_and_makes_no_progress_is_failed_by_its_watchdog(engine):
    worker, deaths, dead = engine
    failpoints.arm("static.round", "hang")  # a round that never starts: no token, no end
    held = sequences(2)
    worker.submit(held)
    for seq in held:
        assert seq.done.wait(60), "the watchdog never failed the stalled engine"
        assert isinstance(seq.error, EngineDied) and "no progress" in str(seq.error)
    assert dead.wait(60) and [name for name, _ in deaths] == ["static"] and engine_health(worker)["status"] == "failed"


@pytest.mark.parametrize("engine", [0.5], indirect=True)
def test_an_idle_engine_is_never_stalled(engine):
    worker, deaths, _ = engine
    [seq] = sequences(1)
    worker.submit([seq])
    assert seq.done.wait(60) and seq.error is None
    assert worker.stalled_s() == 0.0 and not deaths  # nothing held: nothing to progress on


def test_the_app_answers_503_naming_the_dead_engine_and_health_says_failed():
    app = create_app(Config.from_env(vllm_enabled=False, dtype="float32", static_compile="0"))
    try:
        assert app_state(app).engines["static"].wait_ready(120)
        client = app.test_client()
        failpoints.arm("static.round", "raise")
        died = client.post("/generate", json={"prompts": ["Hi"], "max_tokens": 2})
        assert died.status_code == 503 and died.json["type"] == "engine_failed", died.json
        assert "static engine failed" in died.json["error"]
        refused = client.post("/static/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        assert refused.status_code == 503 and refused.json["error"]["code"] == "engine_unavailable"
        assert "InjectedFault" in refused.json["error"]["message"]
        health = client.get("/health")
        assert health.status_code == 503 and health.json["status"] == "failed"
        assert list(health.json["failed"]) == ["static"] and "InjectedFault" in health.json["failed"]["static"]
        begin_shutdown(app)
        assert app_state(app).engines["static"].wait_drained(0)
    finally:
        shutdown(app, timeout=10)


def test_an_engine_whose_load_raises_is_failed_and_runs_its_death_callbacks(runner_fp32):
    """So that its worker leaves and a fresh one loads again, as after a death."""
    from batcher.static.worker import StaticWorker

    failpoints.arm("static.load", "raise")
    worker = StaticWorker(runner_fp32.settings, load_runner=lambda: runner_fp32)
    deaths: list[tuple[str, str]] = []
    dead = threading.Event()
    worker.when_dead(lambda name, error: (deaths.append((name, error)), dead.set()))
    worker.start()
    try:
        assert not worker.wait_ready(60) and worker.status == "failed", engine_health(worker)
        assert dead.wait(30), "a failed load ran no death callback"
        assert deaths == [("static", worker.error)] and "InjectedFault" in worker.error
        assert worker.lifecycle.failed_to_start and not worker.lifecycle.died
        late: list[str] = []
        worker.when_dead(lambda name, error: late.append(name))  # asked after the failure: at once
        assert late == ["static"]
        with pytest.raises(NotReady, match="InjectedFault"):
            worker.submit(sequences(1))
    finally:
        worker.stop()


def test_an_app_whose_vllm_failed_to_load_says_failed_and_reports_the_failed_start(tmp_path):
    """The static engine serves, but the process is leaving: /health is 503 "failed" naming vLLM,
    and the start is reported as failed for the master's count (a ready start resets it)."""
    starts = FailedStarts()
    starts.folder = tmp_path  # what the master's `open` makes before it forks
    config = Config.from_env(vllm_enabled=True, dtype="float32", static_compile="0")

    failpoints.arm("vllm.load", "raise")  # before vLLM is even imported: the test stays cheap
    app = create_app(config)
    try:
        engines = app_state(app).engines
        starts.watch(engines)
        assert engines["static"].wait_ready(120) and not engines["vllm"].wait_ready(120)
        health = app.test_client().get("/health")
        assert health.status_code == 503 and health.json["status"] == "failed", health.json
        assert "InjectedFault" in health.json["failed"]["vllm"]
    finally:
        shutdown(app, timeout=10)
    assert starts.worker_left(os.getpid())["engine"] == "vllm" and starts.in_a_row == 1

    failpoints.disarm()
    app = create_app(Config.from_env(vllm_enabled=False, dtype="float32", static_compile="0"))  # a start that succeeds
    try:
        starts.watch(app_state(app).engines)
        assert app_state(app).engines["static"].wait_ready(120)
        report = tmp_path / str(os.getpid())
        wait_until(report.exists, 30, "the ready start reported")
    finally:
        shutdown(app, timeout=10)
    assert starts.worker_left(os.getpid()) is None and starts.in_a_row == 0 and starts.give_up() is None
