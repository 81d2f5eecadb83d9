"""Drain on SIGTERM: stop admitting, finish what is held, then exit 0.

The engine alone, a gated round, so the order of events is fixed. `make serve` stopped as a user
stops it: tests/e2e/test_drain.py.
"""

from __future__ import annotations

import threading

import pytest

from batcher.errors import ShuttingDown
from batcher.sequence import Status
from tests.helpers.workers import GATE, submit, wait


def test_a_draining_engine_refuses_new_work_and_finishes_what_it_holds(worker, runner):
    running = submit(worker, GATE, "b", "c", "d", max_tokens=8)
    assert runner.entered.wait(30)
    queued = submit(worker, "queued one", "queued two", max_tokens=8)
    worker.begin_drain()
    assert worker.draining and worker.held_at_drain == 6
    with pytest.raises(ShuttingDown):
        submit(worker, "too late")
    assert not worker.wait_drained(0)  # the gated round still runs
    runner.gate.set()
    assert worker.wait_drained(300)
    wait(running + queued)
    assert all(s.status == Status.FINISHED and s.token_ids for s in running + queued)
    assert len(running[0].token_ids) == 8 or running[0].finish_reason == "stop"  # ran to its end
    worker.stop()
    assert worker.abandoned == 0 and worker.status == "stopped"


def test_an_idle_engine_is_drained_at_once(worker):
    worker.begin_drain()
    assert worker.wait_drained(30) and worker.held_at_drain == 0


def test_what_is_still_running_when_the_drain_time_is_up_is_abandoned(worker, runner):
    [running] = submit(worker, GATE, max_tokens=200)
    assert runner.entered.wait(30)
    [queued] = submit(worker, "never runs")
    worker.begin_drain()
    assert not worker.wait_drained(0)
    stopper = threading.Thread(target=worker.stop)
    stopper.start()
    runner.gate.set()
    stopper.join(60)
    wait([running, queued])
    assert isinstance(running.error, ShuttingDown) and isinstance(queued.error, ShuttingDown)
    assert worker.abandoned == 2
