"""Shared fixtures: the real default model, real engines, real apps. Loaded once per session."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import openai
import pytest

from batcher import fence
from batcher.checkpoint import resolve_model
from service import create_app, shutdown
from service.config import Config
from tests.helpers import PINNED, pin_environment
from tests.helpers.servers import KEY, STATIC_SERVER_QUEUE, serving

if TYPE_CHECKING:  # torch and transformers load in the fixtures that need them: xdist's controller
    # loads this file too, alone, before any worker starts (11 s of imports on one core here)
    from batcher.static.runner import Runner

pin_environment()  # PINNED (tests/helpers/__init__.py), for every app, server and child process


@pytest.fixture(scope="session")
def model_path() -> str:
    defaults = Config()
    return resolve_model(defaults.model, defaults.cache_dir)


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory):
    """One real gunicorn, both engines ready, for the modules that only send it requests
    (test_e2e, test_openai, test_openai_fields, test_structured, test_tools, test_fuzz, test_page):
    each start loads both engines, a minute or more on 2 cores, so it starts once, when a module
    first asks, and stops at the end of the session. Its settings satisfy all of them: two API
    keys (test_openai checks that either one is taken, test_page that the page asks for one), at
    most 8 prompts a request (test_openai's 413 at 9), and PINNED's fp32 eager on both engines:
    its tests compare the two engines token for token, while the profile may pick a different
    dtype per engine (on the AMD EPYC here, 2026-12-01: static fp16, vLLM fp32), so the defaults
    are not what they test (`served`, lm-eval's, runs at the defaults). A test that changes a
    server's state or needs other settings starts its own; one that reads the log or the metrics
    reads what its own requests added (`Server.log_mark`)."""
    env = {"API_KEY": f"other-key,{KEY}", "MAX_PROMPTS_PER_REQUEST": "8", "THREADS": "32", **PINNED}
    with serving(tmp_path_factory.mktemp("shared"), env) as srv:
        yield srv


@pytest.fixture(scope="session")
def served(tmp_path_factory):
    """`make serve` at this machine's defaults (every `auto` from its profile, not PINNED: what a
    user runs and scores), both engines ready, an API key set: for lm-eval (test_eval), the slow
    clients (test_slow_clients) and the drain on Ctrl-C (test_drain), which stops it and so runs
    last in their group (the `last` mark). One start for the three, on the path a user takes.
    REQUEST_TIMEOUT_S 600: admission predicts from the step times the engines measured last, and
    lm-eval's runs measure them while lm-eval's own processes share this worker's core; after them,
    at the default 120 s, the drain test's 60-token vLLM stream was once refused 429 on an idle
    engine (2026-12-03). What admission refuses is test_admission's; here it must admit."""
    from tests.helpers.make_serve import MakeServe

    env = {"API_KEY": KEY, "CLIENT_TIMEOUT_S": "600", "GRACEFUL_TIMEOUT": "120", "REQUEST_TIMEOUT_S": "600"}
    env |= {n: "auto" for n in PINNED}
    srv = MakeServe(tmp_path_factory.mktemp("serve"), env)
    try:
        srv.wait_ready(900)
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def static_server(tmp_path_factory):
    """One real gunicorn with the static engine alone (vLLM disabled, no API key), for the tests
    that fill its queue or need a disabled engine: test_openai's 429 the SDK retries and its 503,
    test_admission's deadline behind a backlog, and the bench smoke (`bench --url`). A queue of
    STATIC_SERVER_QUEUE sequences: admission's backlog of 8 and its one more fit even before a
    round takes any (a full queue would answer its generous request 429 queue_full), and
    test_openai fills it to the brim.
    Four rows a round (the default, named here since both tests count on it); a timeout no
    prediction on a busy machine reaches, so that a deadline alone decides; one torch thread,
    since two spinning at every op's barrier on an oversubscribed CPU made a decode step 7 s here
    against 0.3 s with one. Each test waits for what it sent and leaves nothing queued."""
    env = {
        "VLLM_ENABLED": "0",
        "MAX_QUEUE": str(STATIC_SERVER_QUEUE),
        "BATCH_SIZE": "4",
        "THREADS": "16",
        "REQUEST_TIMEOUT_S": "3600",
        "TORCH_THREADS": "1",
    }
    with serving(tmp_path_factory.mktemp("static"), env, ready=("static",), disabled=("vllm",)) as srv:
        yield srv


@pytest.fixture(scope="session")
def runner_fp32(model_path) -> Runner:
    """float32, so that padded and unpadded runs can be compared token for token."""
    from batcher.static.runner import Runner
    from tests.helpers.workers import static_settings

    return Runner(static_settings(model_path, dtype="float32"))


@pytest.fixture(scope="session")
def app():
    """The app as deployed: both engines, in one process; `vllm_app` also asserts that vLLM is ready."""
    # float32 on both engines, so that parity between them is a matter of code, not of rounding
    config = Config.from_env(vllm_enabled=True, dtype="float32", max_prompts_per_request=16, max_body_bytes=64 * 1024)
    app = create_app(config)
    assert app.extensions["engines"]["static"].wait_ready(120), app.extensions["engines"]["static"].health()
    app.config["FIRST_STATIC_ANSWER"] = _first_static_answer(app)
    yield app
    shutdown(app)


def _first_static_answer(app) -> dict:
    """A /generate sent as soon as the static engine is ready, while vLLM is still starting (it
    takes 15-60 s more): what it answered and vLLM's state at that moment. Recorded here, at the
    real start of the session's app, for test_startup.py."""
    vllm = app.extensions["engines"]["vllm"]
    phase_before = vllm.phase
    reply = app.test_client().post("/generate", json={"prompts": ["The capital of France is"], "max_tokens": 4})
    return {"status": reply.status_code, "json": reply.json, "vllm_before": phase_before, "vllm_after": vllm.phase}


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture(scope="session")
def vllm_app(app):
    engine = app.extensions["engines"]["vllm"]
    assert engine.wait_ready(600), f"vLLM engine did not start: {engine.health()}"
    return app


@pytest.fixture
def vllm_client(vllm_app):
    return vllm_app.test_client()


@pytest.fixture
def held_rounds():
    """The fence every static engine in this process takes around each round's model calls
    (batcher/fence.py), held by the test: a round that was taken waits on it, and what arrives
    meanwhile queues up, until the test lets go (if vLLM is tracing its model just then, this
    first waits for that). The session's app or one of the test's own (tests/helpers/apps.py),
    which a test asks for before this: an engine loads its model under the same fence."""
    lock = fence.static_round()
    assert lock.acquire(timeout=600)
    released = threading.Event()

    def release():
        if not released.is_set():
            released.set()
            lock.release()

    yield release
    release()


# --- the OpenAI SDK on the shared server, for each base URL a test's `base` names
@pytest.fixture
def sdk(shared_server, base) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=shared_server.url + base, api_key=KEY, max_retries=0, _strict_response_validation=True
    )


@pytest.fixture
def streaming_sdk(shared_server, base) -> openai.OpenAI:
    """Not strict: OpenAI's own stream chunks carry `finish_reason: null`, which the SDK's strict
    validation (written for whole replies) refuses."""
    return openai.OpenAI(base_url=shared_server.url + base, api_key=KEY, max_retries=0)


# --- a static engine on the real runner with test hooks (tests/helpers/workers.py)
@pytest.fixture
def runner(runner_fp32):
    from tests.helpers.workers import InstrumentedRunner

    return InstrumentedRunner(runner_fp32)


@pytest.fixture
def worker(runner):
    """A started static engine on `runner`: a round holding workers.GATE waits for `runner.gate`."""
    from batcher.static.worker import ModelWorker

    worker = ModelWorker(runner.settings, load_runner=lambda: runner).start()
    assert worker.wait_ready(30)
    yield worker
    runner.gate.set()
    worker.stop()


# --- pytest-xdist: what goes to which worker, and in what order ----------------------------------
# What shares an expensive fixture runs in one worker: the first of SHARED_FIXTURES a test uses
# names its group (the fixture names whose instance costs an engine start or more), else its
# module does (a module's own module-scoped server then starts once). The groups go out longest
# first (LPT), so that no long group starts while the other worker runs out of work (the rolling
# restart once ran last, alone, for 280 s; `served`'s group, priced at its old modules' seconds,
# once left one worker 184 s after the other): COST_S holds each module's seconds (every test and
# fixture of it, summed over both workers) from a quiet run on a warm tree on the AMD EPYC (Zen 4)
# here, 2026-12-03; only the order depends on them, and a module not named counts 1 s a test.
# `make test` passes --no-loadscope-reorder, since xdist would otherwise send the groups with the
# most tests first, whatever they cost.
SHARED_FIXTURES = ("shared_server", "app", "runner_fp32", "static_server", "served")
COST_S = {
    "test_cluster": 180, "test_tools": 130, "test_eval": 126, "test_structured": 103, "test_sampling": 95,
    "test_profile": 72, "test_openai": 71, "test_static_compile": 67, "test_slow_clients": 46, "test_fuzz": 33,
    "test_overload": 50, "test_isolation": 30, "test_page": 29, "test_bench_smoke": 28, "test_drain": 27,
    "test_admission": 23, "test_runner": 20, "test_openai_fields": 18, "test_streaming": 16, "test_echo": 14,
    "test_vllm": 10, "test_api": 10, "test_worker": 9, "test_context": 8, "test_e2e": 7, "test_race": 5,
    "test_kubernetes": 5, "test_hosts": 230, "test_crash_only": 50, "test_request_bounds": 15, "test_recovery": 2,
}  # fmt: skip


def _costs(items: list) -> dict:
    """Each test's estimated seconds: its module's COST_S shared evenly by the module's tests."""
    name = {item: item.module.__name__.rpartition(".")[2] for item in items}
    count: dict[str, int] = {}
    for item in items:
        count[name[item]] = count.get(name[item], 0) + 1
    return {item: COST_S.get(name[item], count[name[item]]) / count[name[item]] for item in items}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Groups the tests and orders the groups longest first (stably: pytest-randomly's order stays
    within each group). The group is xdist's own `xdist_group` mark, added here, before
    pytest-xdist's hook reads it (hence tryfirst) and writes it into the node id that
    `--dist loadgroup` schedules by; that works on pytest 9.1, not 9.2 (requirements-dev.txt)."""
    costs, group, total = _costs(items), {}, {}
    for item in items:
        names = item.fixturenames  # the whole closure: a fixture's own fixtures too
        group[item] = next((name for name in SHARED_FIXTURES if name in names), item.module.__name__)
        total[group[item]] = total.get(group[item], 0.0) + costs[item]
    # a group's tests stay together; one marked `last` (it stops the group's server) goes after the rest
    items.sort(key=lambda item: (-total[group[item]], group[item], item.get_closest_marker("last") is not None))
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group[item]))
