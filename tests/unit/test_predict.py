"""The cost models of batcher/predict.py on measurements fed by hand (no engine needed)."""

import time

import pytest

from batcher.calibration import CALIBRATION_MIN, CALIBRATION_WINDOW, Calibration
from batcher.predict import (
    MAX_AGE_S,
    Prediction,
    StaticCost,
    VLLMCost,
    WidthClock,
    Work,
)


def test_a_clock_knows_nothing_until_fed_then_bounds_a_width_it_has_not_measured():
    clock = WidthClock()
    assert clock.at(4) is None
    clock.observe(1, 0.10)
    clock.observe(4, 60.0)  # a cold first round
    clock.observe(4, 0.30)
    assert clock.at(4) == 0.30  # outvoted at once
    for seconds in (0.5, 0.5, 0.5):  # the load changed: three rounds follow it
        clock.observe(4, seconds)
    assert clock.at(4) == 0.5
    assert clock.at(3) == clock.at(2) == clock.at(4)  # bounded by the wider width measured
    assert clock.at(8) == 1.0  # a narrower one's, scaled by the widths: never its price as it is


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_clocks_samples_age_out_and_leave_it_unknown():
    now = FakeTime()
    clock = WidthClock(now)
    clock.observe(1, 0.3)
    now.now += MAX_AGE_S / 2
    clock.observe(1, 0.3)
    assert clock.at(1) == 0.3
    now.now += MAX_AGE_S / 2 + 1  # the first sample aged out, the second has not
    clock.observe(1, 0.01)
    assert clock.at(1) == 0.01 and clock.shown() == {"1": 10.0}  # low median of (0.3, 0.01)
    now.now += MAX_AGE_S + 1
    assert clock.at(1) is None and clock.shown() == {}


def test_vllm_never_prices_a_wider_engine_at_width_ones_price():
    # issue 41: 300 concurrent requests met clocks that had measured width 1 only, and 64 of them
    # were admitted at width-1 prices, then timed out (504)
    cost = VLLMCost(max_num_seqs=64)
    cost.observe(1, 0.05, admitted=True)
    cost.observe(1, 0.02, admitted=False)
    alone = cost.predict([], [], [Work(64)])
    assert alone.total_s == pytest.approx(0.05 + 63 * 0.02)
    eleventh = cost.predict([Work(64, produced=1)] * 10, [], [Work(64)])  # width 11, never measured
    assert eleventh.total_s == pytest.approx(0.02 / 2 * 11 + 0.05 * 11 + 63 * 0.02 * 11)
    assert cost.unmeasured_room(10, 0) == 54  # what it would take with nothing fresh: no queue


PROFILE = ((1, 0.03), (4, 0.04))  # (width, seconds a token), as batcher/profile/prior.py reads a profile


def test_a_prior_prices_a_fresh_clock_and_fresh_samples_replace_it_width_by_width():
    now = FakeTime()
    clock = WidthClock(now, prior=PROFILE)
    assert (clock.at(1), clock.at(3), clock.at(4), clock.at(8)) == (0.03, 0.04, 0.04, 0.08)  # known at once
    clock.observe(4, 0.2)  # a slow spell at width 4: the live sample, not the prior, prices it
    assert (clock.at(4), clock.at(1)) == (0.2, 0.03) and clock.shown() == {"4": 200.0}
    assert clock.at(4, fastest=True) == 0.04  # an idle engine doubts the spell, not the machine
    assert clock.forgets_in() == MAX_AGE_S
    now.now += MAX_AGE_S + 1  # the spell ages out: back to the prior, never unknown
    assert clock.at(4) == 0.04 and clock.forgets_in() == 0.0
    assert WidthClock(now).at(4, fastest=True) is None  # without a prior, still unknown


def test_a_fresh_static_engine_with_a_profile_predicts_its_first_rounds():
    cost = StaticCost(batch_size=4, wait_s=0.0, prior=PROFILE)
    first = cost.predict([], [], [Work(6)] * 4)
    assert (first.queue_s, first.ttft_s, first.total_s) == pytest.approx((0.0, 0.04, 0.24))
    behind = cost.predict([], [Work(6)] * 60, [Work(6)] * 4)  # the 16th round of a burst
    assert behind.total_s == pytest.approx(16 * 0.24) and cost.has_prior
    assert cost.shown()["profile_ms"] == {"1": 30.0, "4": 40.0}
    assert not StaticCost(batch_size=4, wait_s=0.0).has_prior


def test_static_is_unknown_cold_then_counts_the_rounds_ahead():
    cost = StaticCost(batch_size=4, wait_s=0.0)
    assert not cost.predict([], [], [Work(10)]).known
    cost.observe(4, prefill_s=0.1, steps=11, seconds=1.1)  # 10 steps of 0.1 s after the prefill
    cost.observe(1, prefill_s=0.1, steps=11, seconds=1.1)
    alone = cost.predict([], [], [Work(10)])
    assert (alone.queue_s, alone.ttft_s, alone.total_s) == pytest.approx((0.0, 0.1, 1.0))
    # eight queued ahead: two full rounds of 10 tokens first
    behind = cost.predict([], [Work(10)] * 8, [Work(10)])
    assert behind.queue_s == pytest.approx(2.0) and behind.ahead == 8 and behind.retry_after_s == 2
    # its own six prompts: rounds of four and two
    six = cost.predict([], [], [Work(10)] * 6)
    assert six.ttft_s == pytest.approx(0.1) and six.total_s == pytest.approx(2.0)


def test_static_counts_what_is_left_of_the_running_round_and_a_solo_round():
    cost = StaticCost(batch_size=4, wait_s=0.0)
    cost.observe(1, prefill_s=0.1, steps=11, seconds=1.1)
    running = [Work(10, produced=6, started_at=time.monotonic())]  # 4 steps left
    assert cost.predict(running, [], [Work(10)]).queue_s == pytest.approx(0.4)
    solo = cost.predict([], [Work(10), Work(10, solo=True)], [Work(10)])
    assert solo.queue_s == pytest.approx(2.0)  # the solo prompt has a round of its own


def test_vllm_joins_at_once_with_room_and_waits_for_a_slot_without():
    cost = VLLMCost(max_num_seqs=2)
    assert not cost.predict([], [], [Work(5)]).known
    cost.observe(2, 0.05, admitted=True)
    cost.observe(2, 0.01, admitted=False)
    idle = cost.predict([], [], [Work(5)])
    assert (idle.queue_s, idle.ttft_s) == pytest.approx((0.0, 0.05))
    room = cost.predict([Work(5, produced=1)], [], [Work(5)])  # behind half the step in progress
    assert (room.queue_s, room.ttft_s) == pytest.approx((0.005, 0.055))
    full = cost.predict([Work(5, produced=1), Work(10, produced=2)], [], [Work(5)])
    assert full.queue_s == pytest.approx(0.005 + 4 * 0.01)  # the first slot frees after 4 more steps
    assert full.total_s == pytest.approx(0.045 + 0.05 + 4 * 0.01)


def test_calibration_bounds_a_prediction_by_how_the_last_ones_came_out():
    model = Prediction(0.5, 1.0, 3.0, ahead=2)
    calibration = Calibration()
    for _ in range(CALIBRATION_MIN - 1):
        calibration.observe(1.0, 2.0)
    assert calibration.apply(model).ttft_p90_s == 1.0  # too few to learn from: the cost model's own
    calibration.observe(1.0, 2.0)
    for _ in range(2):  # two of ten came out three times later than predicted
        calibration.observe(1.0, 3.0)
    out = calibration.apply(model)
    assert (out.queue_s, out.ttft_s, out.total_s, out.ahead) == (0.5, 1.0, 3.0, 2)  # the model's own
    assert out.ttft_p90_s == pytest.approx(3.0)  # its bound: the 90th percentile of the ratios, 3
    assert calibration.shown() == {"sequences": 10, "p50": 2.0, "p90": 3.0}
    calibration.observe(None, 1.0)  # an unknown prediction teaches nothing
    assert calibration.shown()["sequences"] == 10
    unknown = Prediction(None, None, None, 0)
    assert calibration.apply(unknown) is unknown


def test_calibration_forgets_beyond_its_window():
    calibration = Calibration()
    for _ in range(CALIBRATION_WINDOW):
        calibration.observe(1.0, 4.0)
    for _ in range(CALIBRATION_WINDOW):
        calibration.observe(1.0, 1.0)
    assert calibration.factor(0.9) == 1.0 and calibration.shown()["sequences"] == CALIBRATION_WINDOW
