"""The model thread with the real model: rounds, mapping by id, the log line, failures, shutdown."""

import logging
import threading

import pytest

from batcher.errors import RoundFailed, ShuttingDown
from batcher.sampling import SamplingParams
from batcher.sequence import Sequence, Status
from tests.helpers.workers import GATE, POISON, submit, wait


def test_requests_arriving_together_share_rounds_across_request_boundaries(worker, runner):
    [blocker] = submit(worker, GATE)
    assert runner.entered.wait(30)  # the model thread is busy: A..E queue up meanwhile
    a, b = submit(worker, "Apples are", "Bananas are")
    c, d, e = submit(worker, "Cherries are", "Dates are", "Elderberries are")
    runner.gate.set()
    wait([blocker, a, b, c, d, e])
    assert a.round == b.round == c.round == d.round == blocker.round + 1
    assert e.round == a.round + 1
    assert (a.batch_size, e.batch_size) == (4, 1)


def test_a_solo_prompt_runs_alone_between_full_rounds(worker, runner):
    [blocker] = submit(worker, GATE)
    assert runner.entered.wait(30)  # everything below queues behind the running round
    before = submit(worker, "Apples are", "Bananas are", "Cherries are", "Dates are")
    [solo] = submit(worker, "The capital of France is", solo=True)
    after = submit(worker, "Figs are", "Grapes are", "Kiwis are", "Lemons are")
    runner.gate.set()
    wait([blocker, *before, solo, *after])
    assert {s.round for s in before} == {blocker.round + 1} and before[0].batch_size == 4
    assert (solo.round, solo.batch_size, solo.batch_shape[0]) == (blocker.round + 2, 1, 1)
    assert {s.round for s in after} == {blocker.round + 3} and after[0].batch_size == 4
    assert solo.text.startswith(" Paris")


def test_each_result_goes_back_to_its_own_sequence(worker, runner_fp32):
    prompts = ["The capital of France is", "Water boils at", "Hi", "One plus one is", "The sky is"]
    seqs = submit(worker, *prompts)
    wait(seqs)
    for seq in seqs:  # the same text as the prompt run alone
        alone = Sequence(seq.prompt, SamplingParams(max_tokens=5))
        runner_fp32.generate([alone], runner_fp32.encode([alone.prompt]))
        assert seq.text == alone.text, seq.prompt
    assert worker.inflight() == 0


def test_one_log_line_per_round_in_the_write_ups_form(worker, caplog):
    with caplog.at_level(logging.INFO, logger="batcher.static.worker"):
        wait(submit(worker, "a b c d e f g h", "b", "c", "d", "e", "f"))
    lines = [r.getMessage() for r in caplog.records if "Batch input shape" in r.getMessage()]
    assert len(lines) == 2
    assert "Batch input shape: torch.Size([4, " in lines[0] and "seq-" in lines[0]
    assert "Batch input shape: torch.Size([2, 1])" in lines[1]


def test_a_failing_round_fails_only_its_own_sequences(worker, runner):
    [blocker] = submit(worker, GATE)
    assert runner.entered.wait(30)
    doomed = submit(worker, POISON, "innocent bystander in the same round")
    later = submit(worker, "a", "b", "c", "d", "a later round")  # fills the bad round, then more
    runner.gate.set()
    wait([blocker, *doomed, *later])
    bad_round = doomed[0].round
    in_bad = [s for s in doomed + later if s.round == bad_round]
    assert all(s.status == Status.FAILED and isinstance(s.error, RoundFailed) for s in in_bad)
    survivors = [s for s in later if s.round != bad_round]
    assert survivors and all(s.status == Status.FINISHED and s.text for s in survivors)
    assert worker.status == "ready"
    assert worker.inflight() == 0


def test_shutdown_fails_waiting_sequences_and_abandons_the_running_round(worker, runner):
    [running] = submit(worker, GATE, max_tokens=200, ignore_eos=True)  # only abandoning ends it early
    assert runner.entered.wait(30)
    waiting = submit(worker, "never", "runs")
    stopper = threading.Thread(target=worker.stop)
    stopper.start()
    runner.gate.set()
    stopper.join(60)
    assert not stopper.is_alive() and worker.status == "stopped"
    wait([running, *waiting])
    assert all(isinstance(s.error, ShuttingDown) for s in [running, *waiting])
    assert len(running.token_ids) < 200  # abandoned at the next step, not run to the end
    assert worker.inflight() == 0
    with pytest.raises(ShuttingDown):
        submit(worker, "too late")


def test_a_cancelled_running_sequence_stops_at_the_next_step(worker, runner):
    [seq] = submit(worker, GATE, max_tokens=200)
    assert runner.entered.wait(30)
    seq.cancel()
    runner.gate.set()
    wait([seq])
    assert seq.status == Status.CANCELLED and seq.finish_reason == "cancelled"
    assert len(seq.token_ids) <= 1
