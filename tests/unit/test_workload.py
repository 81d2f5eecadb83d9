"""The queue alone: what is waiting now, FIFO, rounds of at most N, the bound, cancellation, and
interactive work before batch lines."""

import math
import threading

import pytest

from batcher.errors import QueueFull
from batcher.sequence import Priority, Sequence, Status
from batcher.workload import Workload
from tests.helpers import WatchedQueue, wait_until


def seqs(*prompts):
    return [Sequence(p) for p in prompts]


def watched(maxsize):
    w = Workload(maxsize)
    w._queue = WatchedQueue()
    return w


def test_takes_what_is_waiting_now_without_waiting_for_a_full_batch():
    w = Workload(16)
    a, b = seqs("a", "b")
    w.put_all([a, b])
    assert w.next_batch(4) == [a, b]


def test_six_prompts_make_rounds_of_four_and_two_in_fifo_order():
    w = Workload(16)
    six = seqs(*"abcdef")
    w.put_all(six)
    assert w.next_batch(4) == six[:4]
    assert w.next_batch(4) == six[4:]


def test_rounds_ignore_request_boundaries():
    w = Workload(16)
    a, b, c, d, e = seqs(*"ABCDE")
    w.put_all([a, b])  # request 1
    w.put_all([c, d, e])  # request 2
    assert w.next_batch(4) == [a, b, c, d]
    assert w.next_batch(4) == [e]


def test_a_request_that_does_not_fit_is_refused_whole():
    w = Workload(3)
    w.put_all(seqs("a", "b"))
    with pytest.raises(QueueFull):
        w.put_all(seqs("c", "d"))
    assert w.qsize() == 2
    w.put_all(seqs("e"))
    assert w.qsize() == 3
    assert [s.prompt for s in w.drain()] == ["a", "b", "e"]  # nothing of the refused request


def test_cancelled_sequences_are_skipped_and_forgotten():
    w = Workload(8)
    a, b, c = seqs("a", "b", "c")
    w.put_all([a, b, c])
    b.cancel()
    assert w.next_batch(4) == [a, c]
    assert b.done.is_set() and b.status == Status.CANCELLED
    assert w.qsize() == 0 and w.drain() == []


def test_blocks_when_idle_and_wakes_on_a_put():
    w = watched(8)
    got = []
    consumer = threading.Thread(target=lambda: got.append(w.next_batch(4)))
    consumer.start()
    assert w._queue.consumer_waits.wait(10)
    a = Sequence("a")
    w.put_all([a])
    consumer.join(10)
    assert got == [[a]]


def test_wake_unblocks_an_idle_consumer_with_nothing():
    w = Workload(8)
    got = []
    consumer = threading.Thread(target=lambda: got.append(w.next_batch(4)))
    consumer.start()
    w.wake()
    consumer.join(10)
    assert got == [[]]


def test_batch_wait_collects_a_fuller_batch():
    w = Workload(8)
    c, d = seqs("c", "d")
    w.put_all([c])
    got = []
    consumer = threading.Thread(target=lambda: got.append(w.next_batch(2, wait_s=30.0)))
    consumer.start()
    wait_until(lambda: w.qsize() == 0, what="the consumer to take c")
    w.put_all([d])  # arrives after c was taken, within the wait
    consumer.join(30)
    assert got == [[c, d]]


def test_without_batch_wait_a_round_does_not_wait_for_latecomers():
    w = Workload(8)
    c = Sequence("c")
    w.put_all([c])
    assert w.next_batch(2, wait_s=0.0) == [c]


def test_a_consumer_woken_by_a_request_sees_all_of_its_prompts():
    w = watched(16)
    got = []
    consumer = threading.Thread(target=lambda: got.append(w.next_batch(4)))
    consumer.start()
    assert w._queue.consumer_waits.wait(10)
    six = seqs(*"abcdef")
    w.put_all(six)  # the consumer was already waiting: it must still get a full round
    consumer.join(10)
    assert got == [six[:4]]
    assert w.next_batch(4) == six[4:]
    assert w.qsize() == 0


def test_drain_returns_everything_still_queued():
    w = Workload(16)
    six = seqs(*"abcdef")
    w.put_all(six[:3])
    w.put_all(six[3:])
    assert w.next_batch(2) == six[:2]
    assert w.drain() == six[2:]
    assert w.qsize() == 0


def test_a_solo_sequence_never_shares_its_round():
    w = Workload(16)
    a, b, c, d = seqs(*"abcd")
    solo = Sequence("alone", solo=True)
    e, f = seqs("e", "f")
    w.put_all([a, b])
    w.put_all([solo])
    w.put_all([c, d, e, f])
    assert w.next_batch(4) == [a, b]  # the round ends before it
    assert w.next_batch(4, wait_s=30.0) == [solo]  # alone, without waiting for a fuller round
    assert w.next_batch(4) == [c, d, e, f]


def test_a_cancelled_solo_sequence_does_not_cut_a_round_short():
    w = Workload(16)
    a, b = seqs("a", "b")
    solo = Sequence("alone", solo=True)
    w.put_all([a])
    w.put_all([solo])
    w.put_all([b])
    solo.cancel()
    assert w.next_batch(4) == [a, b]
    assert solo.status == Status.CANCELLED


# --- priorities: interactive work first, batch lines in the room it leaves ------------------------
def batch_seqs(*prompts):
    return [Sequence(p, priority=Priority.BATCH) for p in prompts]


def test_interactive_sequences_put_after_batch_ones_are_handed_out_first():
    w = Workload(16)
    b1, b2 = batch_seqs("b1", "b2")
    i1, i2 = seqs("i1", "i2")
    w.put_all([b1])
    w.put_all([i1])
    w.put_all([b2])
    w.put_all([i2])
    assert w.queued() == [i1, i2, b1, b2]  # as next_batch hands them out
    assert w.next_batch(3) == [i1, i2, b1]  # a batch line fills only what the round leaves
    assert w.next_batch(3) == [b2]


def test_an_interactive_request_goes_before_the_rest_of_a_batch_request_already_pulled():
    w = Workload(16)
    b1, b2, b3 = batch_seqs("b1", "b2", "b3")
    w.put_all([b1, b2, b3])
    assert w.next_batch(1) == [b1]  # b2 and b3 wait in the consumer's carry
    i1 = Sequence("i1")
    w.put_all([i1])
    assert w.next_batch(1) == [i1]
    assert w.next_batch(4) == [b2, b3]


def test_a_batch_sequence_never_displaces_an_interactive_one_from_a_round():
    w = Workload(16)
    lines = batch_seqs(*"abcd")
    w.put_all(lines)
    interactive = seqs("x", "y", "z")
    for seq in interactive:
        w.put_all([seq])
    assert w.next_batch(4) == [*interactive, lines[0]]
    assert w.next_batch(4) == lines[1:]


def test_batch_work_never_fills_the_queue_for_an_interactive_request():
    w = Workload(2)
    w.put_all(batch_seqs("b1", "b2"))
    w.put_all(seqs("i1", "i2"))  # the batch lines queued run after these: they do not count
    with pytest.raises(QueueFull):
        w.put_all(seqs("i3"))  # the interactive bound holds
    with pytest.raises(QueueFull):
        w.put_all(batch_seqs("b3"))  # a batch request counts everything: it is the one refused
    assert (w.qsize(), w.qsize(Priority.INTERACTIVE)) == (4, 2)


def test_cancelled_and_drained_sequences_of_both_priorities():
    w = Workload(8)
    b1, b2 = batch_seqs("b1", "b2")
    i1, i2 = seqs("i1", "i2")
    w.put_all([b1, b2])
    w.put_all([i1, i2])
    b1.cancel()
    i1.cancel()
    assert w.purge_cancelled() == 2 and w.qsize() == 2
    assert w.drain() == [i2, b2]
    assert b1.status == i1.status == Status.CANCELLED


def test_a_round_that_begins_with_a_batch_line_waits_to_fill():
    """The batch runner's lines arrive one request thread at a time: a round of batch work waits
    `fill_s` for the rest of a round, where an interactive one would not wait at all."""
    w = Workload(8)
    first, *rest = batch_seqs("b1", "b2", "b3")
    w.put_all([first])
    got = []
    consumer = threading.Thread(target=lambda: got.append(w.next_batch(3, fill_s=30.0)))
    consumer.start()
    wait_until(lambda: w.qsize() == 0, what="the consumer to take b1")
    for seq in rest:  # after b1 was taken, within the fill
        w.put_all([seq])
    consumer.join(30)
    assert got == [[first, *rest]]
    i = Sequence("i")
    w.put_all([i])
    assert w.next_batch(3, fill_s=30.0) == [i]  # an interactive round does not wait for batch work


def test_interactive_quiet_is_zero_while_interactive_work_is_held_and_counts_from_its_end():
    w = Workload(16)
    (line,) = batch_seqs("line")
    w.put_all([line])
    assert w.interactive_quiet_s() == math.inf  # batch work alone: the engine never held interactive work
    (a,) = seqs("a")
    w.put_all([a])
    assert w.interactive_quiet_s() == 0.0  # queued
    assert w.next_batch(4) == [a, line]
    assert w.interactive_quiet_s() == 0.0  # taken, running
    w.release(line)
    assert w.interactive_quiet_s() == 0.0  # a batch line's end changes nothing
    w.release(a)
    assert 0.0 <= w.interactive_quiet_s() < math.inf  # counted from the interactive sequence's end
    w.put_all(seqs("b"))
    assert w.interactive_quiet_s() == 0.0
