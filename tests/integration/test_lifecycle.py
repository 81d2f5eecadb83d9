"""An engine's lifecycle under one lock, and the workload's count of what is taken: the three
races of issue 19, each forced with events and patched hooks (no sleeps), on the real model."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from batcher.errors import ShuttingDown
from batcher.sequence import Sequence
from batcher.static.worker import StaticWorker
from service.ops.health import engine_health
from tests.helpers import WatchedQueue
from tests.helpers.workers import GATE, submit


class ContendedLock:
    """The lifecycle's lock, saying when a thread finds it held and has to wait for it."""

    def __init__(self, lock, on_contention):
        self._lock, self._on_contention = lock, on_contention

    def __enter__(self):
        if not self._lock.acquire(blocking=False):
            self._on_contention()
            self._lock.acquire()
        return self

    def __exit__(self, *exc):
        self._lock.release()


def test_a_drain_that_begins_during_an_admission_refuses_it_or_counts_it(worker, runner):
    [blocker] = submit(worker, GATE)  # the model thread waits in a round: what comes next stays queued
    assert runner.entered.wait(30)
    drain_ran_or_waits = threading.Event()
    worker.lifecycle.lock = ContendedLock(worker.lifecycle.lock, drain_ran_or_waits.set)
    drainer = threading.Thread(target=lambda: (worker.begin_drain(), drain_ran_or_waits.set()))
    check_token_ids = worker._check_token_ids

    def drain_between_check_and_enqueue(seqs):  # submit() calls it after the availability check
        drainer.start()
        assert drain_ran_or_waits.wait(30)
        check_token_ids(seqs)

    worker._check_token_ids = drain_between_check_and_enqueue
    try:
        admitted = len(submit(worker, "admitted as the drain begins"))
    except ShuttingDown:
        admitted = 0
    drainer.join(30)
    assert worker.draining
    # what the drain holds is what it will finish: the running round, and the new prompt if taken
    assert worker.held_at_drain == 1 + admitted == worker.inflight()


@pytest.mark.parametrize("load_ends", ["ready", "failed"])
def test_an_engine_stopped_while_it_loads_stays_stopped(runner_fp32, load_ends):
    loading, finish_load = threading.Event(), threading.Event()

    def slow_load():
        loading.set()
        assert finish_load.wait(60)
        if load_ends == "failed":
            raise RuntimeError("the load failed after the stop")
        return runner_fp32

    worker = StaticWorker(runner_fp32.settings, load_runner=slow_load).start()
    assert loading.wait(30)
    worker.stop(timeout=0)  # the join gives up at once: the load goes on in the engine thread
    assert worker.status == "stopped"
    finish_load.set()
    worker._thread.join(60)
    assert not worker._thread.is_alive()
    assert worker.status == "stopped" and not worker.wait_ready(0)
    with pytest.raises(ShuttingDown):
        worker.submit([Sequence("too late")])


def test_a_batch_waiting_for_latecomers_is_held_counted_and_abandoned(runner_fp32):
    settings = dataclasses.replace(runner_fp32.settings, batch_wait_ms=600_000)  # waits for a full round
    worker = StaticWorker(settings, load_runner=lambda: runner_fp32)
    watched = worker.workload._queue = WatchedQueue()
    worker.start()
    try:
        assert worker.wait_ready(30)
        assert watched.consumer_waits.wait(30)  # idle: the model thread waits for work
        watched.consumer_waits.clear()
        [seq] = submit(worker, "taken, then waiting for a fuller round", max_tokens=50, ignore_eos=True)
        assert watched.consumer_waits.wait(30)  # it took the prompt and waits for latecomers
        assert worker.workload.qsize() == 0 and not seq.entered.is_set()
        assert worker.inflight() == 1 and engine_health(worker)["inflight"] == 1
        worker.begin_drain()
        assert worker.held_at_drain == 1 and not worker.wait_drained(0)
    finally:
        worker.stop()
    assert seq.done.wait(60) and isinstance(seq.error, ShuttingDown)
    assert worker.abandoned == 1 and worker.inflight() == 0
