"""The bounded queue between the request threads and the model thread, interactive work first and
FIFO within a priority, and what the model thread took from it and has not yet resolved."""

from __future__ import annotations

import collections
import queue
import threading
import time

from batcher.errors import QueueFull
from batcher.sequence import Priority, Sequence


class Workload:
    """A `queue.Queue` of requests' sequences, drained a batch at a time by one consumer.

    A request's sequences go in as one item, so they become visible together: a consumer that
    wakes on a request of six takes four, not whichever of the six were put by then. What a
    round leaves of a request waits in `_carry` (the consumer's alone) for the next round, so
    rounds still ignore request boundaries. The bound counts sequences, all or nothing per
    request. A sequence marked `solo` runs in a round of its own: it never shares one.

    Interactive sequences are handed out before batch ones (`Priority`), whenever they came, so
    a batch line fills only what a round or a step has left; FIFO within a priority. The bound
    keeps batch work from taking an interactive request's place: a request counts only what is
    queued at its own priority or a more urgent one, so an interactive request never finds the
    queue full of batch lines, while a batch request counts everything and is the one refused.

    A sequence `next_batch` takes is *taken* from that moment (also while a batch waits for
    latecomers, BATCH_WAIT_MS) until the engine `release`s it, just before resolving it: queued
    plus taken is what an engine holds, one count under one lock.
    """

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._queue: queue.Queue[list[Sequence] | None] = queue.Queue()
        # per priority, most urgent first: the consumer's (_carry), and the sequences in _queue and
        # _carry, oldest first (_waiting: put_all appends, _take pops); a _carry is its _waiting's head
        self._carry = {p: collections.deque() for p in Priority}
        self._waiting = {p: collections.deque() for p in Priority}
        self._lock = threading.Lock()
        self._taken: dict[str, Sequence] = {}  # by id, in the order taken
        self._interactive_at = float("-inf")  # when interactive work was last queued or resolved (monotonic)

    def qsize(self, upto: Priority = max(Priority)) -> int:
        """Queued sequences (of priority `upto` or more urgent; all by default), not counting
        cancelled ones: a cancelled sequence frees its place in the bound at once, though it stays
        in the queue until the consumer passes it (`purge_cancelled`, or `next_batch` on its way)."""
        with self._lock:
            return self._live(upto)

    def _live(self, upto: Priority = max(Priority)) -> int:
        """Live queued sequences of priority `upto` or more urgent (a few µs: the bound keeps it short)."""
        return sum(not seq.cancelled for p, waiting in self._waiting.items() if p <= upto for seq in waiting)

    def _count(self) -> int:
        return sum(len(waiting) for waiting in self._waiting.values())

    def queued(self) -> list[Sequence]:
        """The queued sequences in the order `next_batch` hands them out (by priority, then oldest
        first): a snapshot, cancelled ones included."""
        with self._lock:
            return [seq for waiting in self._waiting.values() for seq in waiting]

    def running(self) -> int:
        """Sequences taken and not yet released."""
        return len(self._taken)

    def inflight(self) -> int:
        """Queued or taken: everything the engine still has to resolve."""
        with self._lock:
            return self._count() + len(self._taken)

    def interactive_quiet_s(self) -> float:
        """Seconds since the engine last held interactive work: 0 while it holds some (queued or
        taken). What a batch runner reads to tell spare room from a lull between requests."""
        with self._lock:
            taken = any(seq.priority == Priority.INTERACTIVE for seq in self._taken.values())
            if taken or self._live(Priority.INTERACTIVE):
                return 0.0
            return time.monotonic() - self._interactive_at

    def taken(self) -> list[Sequence]:
        with self._lock:
            return list(self._taken.values())

    def find(self, seq_id: str) -> Sequence | None:
        return self._taken.get(seq_id)

    def release(self, seq: Sequence) -> None:
        """The engine is about to resolve `seq`: it no longer holds it."""
        with self._lock:
            self._taken.pop(seq.id, None)
            if seq.priority == Priority.INTERACTIVE:
                self._interactive_at = time.monotonic()

    def put_all(self, seqs: list[Sequence]) -> None:
        """Enqueue one request's sequences, or none (QueueFull): against the bound count what is
        queued at the request's priority or a more urgent one, never what would run after it."""
        with self._lock:
            queued = self._live(max((seq.priority for seq in seqs), default=Priority.INTERACTIVE))
            if queued + len(seqs) > self.maxsize:
                raise QueueFull(f"queue holds {queued} of {self.maxsize} sequences; {len(seqs)} more do not fit")
            for seq in seqs:
                self._waiting[seq.priority].append(seq)
                if seq.priority == Priority.INTERACTIVE:
                    self._interactive_at = time.monotonic()
            self._queue.put_nowait(list(seqs))

    def wake(self) -> None:
        """Unblock a consumer waiting in next_batch (used at shutdown)."""
        self._queue.put_nowait(None)

    def _head(self) -> Sequence | None:
        """The sequence the consumer hands out next, of those it pulled: the most urgent, oldest."""
        return next((carry[0] for carry in self._carry.values() if carry), None)

    def _file(self, item: list[Sequence]) -> None:
        for seq in item:
            self._carry[seq.priority].append(seq)

    def _take(self, priority: Priority, *, hold: bool) -> tuple[Sequence, bool]:
        """The oldest queued sequence of `priority`, and whether it is taken (held): not if it was cancelled."""
        with self._lock:
            seq = self._carry[priority].popleft()
            self._waiting[priority].popleft()  # the same one: both hold what waits in the order it came
            held = hold and not seq.cancelled
            if held:
                self._taken[seq.id] = seq
        return seq, held

    def next_batch(
        self, size: int, wait_s: float = 0.0, idle_timeout: float | None = None, *, fill_s: float = 0.0
    ) -> list[Sequence]:
        """Block until one live sequence waits, then take what is waiting now, oldest first, up to
        `size`; with `wait_s` > 0, wait up to that long for a fuller batch, and `fill_s` when the
        batch begins with a batch sequence (batch work can wait for a full round). Interactive sequences
        first, also those put after a batch one: a batch sequence fills only what they leave.
        Cancelled sequences are dropped on the way; a solo sequence ends the batch before it, or
        is the whole batch. Returns [] on `wake()` or after `idle_timeout` with nothing."""
        batch: list[Sequence] = []
        deadline = None
        while len(batch) < size and not (batch and batch[0].solo):
            head = self._head()
            if head is not None and head.priority > Priority.INTERACTIVE:
                self._pull()  # before a batch sequence: an interactive one put since goes first
                head = self._head()
            if head is None:
                try:
                    if not batch:
                        item = self._queue.get(timeout=idle_timeout)
                    elif deadline is None:
                        item = self._queue.get_nowait()
                    else:
                        item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:  # woken up
                    break
                self._file(item)
                continue
            if batch and head.solo and not head.cancelled:
                break  # it waits for the next round, which it will have to itself
            seq, held = self._take(head.priority, hold=True)
            if not held:  # its request gave up while it waited: skip it
                seq.finish("cancelled")
                continue
            batch.append(seq)
            wait = wait_s if batch[0].priority == Priority.INTERACTIVE else max(wait_s, fill_s)
            if deadline is None and wait > 0:
                deadline = time.monotonic() + wait
        return batch

    def purge_cancelled(self) -> int:
        """The consumer only: drop the cancelled sequences still queued (each finished
        "cancelled"), so that an engine with no room to take work, such as a vLLM engine with
        every slot busy, does not keep them. Returns how many it dropped."""
        dropped = []
        with self._lock:
            if self._live() == self._count():
                return 0
            self._pull()  # now each _carry is all of its _waiting
            for priority, carry in self._carry.items():
                kept = collections.deque(seq for seq in carry if not seq.cancelled)
                dropped += [seq for seq in carry if seq.cancelled]
                self._carry[priority], self._waiting[priority] = kept, collections.deque(kept)
        for seq in dropped:
            seq.finish("cancelled")
        return len(dropped)

    def _pull(self) -> None:
        """Everything put so far into the carries (the consumer's), in order; a wake-up is kept."""
        woken = False
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                woken = True
            else:
                self._file(item)
        if woken:
            self._queue.put_nowait(None)

    def drain(self) -> list[Sequence]:
        """Take everything left (shutdown); the caller resolves them."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                self._file(item)
        left = []
        for priority, carry in self._carry.items():
            while carry:
                left.append(self._take(priority, hold=False)[0])
        return left
