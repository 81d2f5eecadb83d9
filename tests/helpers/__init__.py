"""What more than one test module uses: plain functions, classes and constants, imported by name
(`from tests.helpers import wait_until`). The fixtures are in the conftest.py of each tier
(tests/unit, tests/integration, tests/e2e) and in tests/conftest.py; no test module imports from
another, but tests/integration/test_batch_postgres.py, which runs the store tests of
tests/unit/test_batch_store.py again on PostgreSQL.

  __init__     waiting and a watched queue, the environment the model tests pin, the OpenAI names every tier uses
  workers      the static engine's runner and model thread with test hooks (imports torch)
  apps         an app in this process: one of a test's own, a JSON post, its counters, over HTTP
  servers      a real gunicorn: started and stopped, its API key, what it holds
  make_serve   `make serve` as a user runs it
  traffic      the load the rolling restarts send
  profile      fakes for the profile's measuring logic: a clock, the reference's tokens
  postgres     a real PostgreSQL server of the test's own (initdb, pg_ctl), a database per test
"""

from __future__ import annotations

import os
import queue
import tempfile
import threading
import time
from collections.abc import Callable

import pytest

# What the model tests pin where they do not test the defaults (an operator's environment still
# wins): fp32, so engines compare to rounding, and eager, so no test server compiles at its start
# when this machine's profile (batcher/profile) chose compiled decoding. Set in the environment by
# the integration and e2e conftests at their import (`pin_environment`), so that every app, server
# and child process a test starts inherits it; `shared_server` names it too, since its tests compare the two
# engines and the profile may give them different dtypes.
PINNED = {"DTYPE": "float32", "STATIC_COMPILE": "0", "VLLM_ENFORCE_EAGER": "1"}

MODEL = "SmolLM2-135M-Instruct"  # the served model's id in /v1/models
PARIS = "The capital of France is"
BASES = pytest.mark.parametrize("base", ["/v1", "/static/v1"])  # vLLM's OpenAI routes, then the static engine's


def pin_environment() -> None:
    """PINNED into os.environ where the operator has not set the name, and DATA_DIR a folder of
    this test process's own: no test's batch runs in another's runner, nor in the checkout's."""
    for name, value in PINNED.items():
        os.environ.setdefault(name, value)
    os.environ.setdefault("DATA_DIR", tempfile.mkdtemp(prefix="batcher-test-data-"))


def wait_until(
    predicate: Callable[[], bool], timeout: float = 30.0, what: str = "condition", every: float = 0.02
) -> None:
    """Poll with a deadline (for state another thread or process changes and no event announces);
    `every`: seconds between looks (a look over HTTP costs the server a request)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


class WatchedQueue(queue.Queue):
    """A queue that says when a consumer found it empty. `get()` checks the size under the
    queue's lock and waits on a condition that releases that lock atomically, so a `put()` made
    after `consumer_waits` is set can only run once the consumer is waiting: the race is forced."""

    def __init__(self):
        super().__init__()
        self.consumer_waits = threading.Event()

    def _qsize(self):
        size = super()._qsize()
        if size == 0:
            self.consumer_waits.set()
        return size
