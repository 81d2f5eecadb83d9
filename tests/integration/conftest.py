"""The integration tier: the app (`create_app`) and the static engine's runner on the real model,
in this process, driven through Flask's test client or directly. The session's app and runner load
once per xdist worker; a test that needs other settings or changes an app's state makes one of its
own (tests/helpers/apps.py), so that no test changes an app another test uses."""

from __future__ import annotations

import threading

import pytest

from batcher import fence
from batcher.static.runner import Runner
from batcher.static.worker import StaticWorker
from service import create_app, shutdown
from service.config import Config
from service.http.state import app_state
from service.ops.health import engine_health
from tests.helpers import pin_environment
from tests.helpers.workers import InstrumentedRunner, static_settings

# DTYPE=float32, STATIC_COMPILE=0, VLLM_ENFORCE_EAGER=1 where the environment does not say
# otherwise (PINNED, tests/helpers/__init__.py), set here, at import, for every app made with
# Config.from_env and every child process a test starts: engines compare to rounding, and nothing
# compiles at an app's start where this machine's profile chose compiled decoding.
pin_environment()


@pytest.fixture(scope="session")
def runner_fp32(model_path) -> Runner:
    """float32, so that padded and unpadded runs can be compared token for token."""
    return Runner(static_settings(model_path, dtype="float32"))


@pytest.fixture(scope="session")
def app():
    """The app as deployed: both engines, in one process; `vllm_app` also asserts that vLLM is ready."""
    # float32 on both engines, so that parity between them is a matter of code, not of rounding
    config = Config.from_env(vllm_enabled=True, dtype="float32", max_prompts_per_request=16, max_body_bytes=64 * 1024)
    app = create_app(config)
    assert app_state(app).engines["static"].wait_ready(120), engine_health(app_state(app).engines["static"])
    app.config["FIRST_STATIC_ANSWER"] = _first_static_answer(app)
    yield app
    shutdown(app)


def _first_static_answer(app) -> dict:
    """A /generate sent as soon as the static engine is ready, while vLLM is still starting (it
    takes 15-60 s more): what it answered and vLLM's state at that moment. Recorded here, at the
    real start of the session's app, for test_startup.py."""
    vllm = app_state(app).engines["vllm"]
    phase_before = vllm.phase
    reply = app.test_client().post("/generate", json={"prompts": ["The capital of France is"], "max_tokens": 4})
    return {"status": reply.status_code, "json": reply.json, "vllm_before": phase_before, "vllm_after": vllm.phase}


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture(scope="session")
def vllm_app(app):
    engine = app_state(app).engines["vllm"]
    assert engine.wait_ready(600), f"vLLM engine did not start: {engine_health(engine)}"
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


# --- a static engine on the real runner with test hooks (tests/helpers/workers.py) ---------------
@pytest.fixture
def runner(runner_fp32):
    return InstrumentedRunner(runner_fp32)


@pytest.fixture
def worker(runner):
    """A started static engine on `runner`: a round holding workers.GATE waits for `runner.gate`."""
    worker = StaticWorker(runner.settings, load_runner=lambda: runner).start()
    assert worker.wait_ready(30)
    yield worker
    runner.gate.set()
    worker.stop()
