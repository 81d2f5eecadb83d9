"""The bounded FIFO queue between the request threads and the model thread."""

from __future__ import annotations

import queue
import threading
import time

from batcher.errors import QueueFull
from batcher.sequence import Sequence


class Workload:
    """A `queue.Queue` of sequences, filled all-or-nothing per request, drained a batch at a time.

    It also keeps the map of live sequences (queued or running) by id, so that one place can
    tell what is in flight; the consumer calls `release()` once a sequence is resolved.
    """

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._queue: queue.Queue[Sequence | None] = queue.Queue()  # the bound is ours, see put_all
        self._put_lock = threading.Lock()
        self._live: dict[str, Sequence] = {}
        self._live_lock = threading.Lock()

    def qsize(self) -> int:
        """Queued sequences (cancelled ones not yet drained included)."""
        return self._queue.qsize()

    def live(self) -> dict[str, Sequence]:
        """Sequences queued or running, by id (a copy)."""
        with self._live_lock:
            return dict(self._live)

    def release(self, seq: Sequence) -> None:
        with self._live_lock:
            self._live.pop(seq.id, None)

    def put_all(self, seqs: list[Sequence]) -> None:
        # Only putters take this lock and the consumer only removes, so the free space seen
        # under the lock can only grow before we put: a request goes in whole or not at all.
        with self._put_lock:
            if self._queue.qsize() + len(seqs) > self.maxsize:
                raise QueueFull(
                    f"queue holds {self._queue.qsize()} of {self.maxsize} sequences; {len(seqs)} more do not fit"
                )
            with self._live_lock:
                self._live.update((seq.id, seq) for seq in seqs)
            for seq in seqs:
                self._queue.put_nowait(seq)

    def wake(self) -> None:
        """Unblock a consumer waiting in next_batch (used at shutdown)."""
        self._queue.put_nowait(None)

    def next_batch(self, size: int, wait_s: float = 0.0, idle_timeout: float | None = None) -> list[Sequence]:
        """Block until one live sequence waits, then take what is waiting now, oldest first, up to
        `size`; with `wait_s` > 0, wait up to that long for a fuller batch. Cancelled sequences
        are dropped on the way. Returns [] on `wake()` or after `idle_timeout` with nothing."""
        batch: list[Sequence] = []
        deadline = None
        while len(batch) < size:
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
            if item.cancelled:  # its request gave up while it waited: skip it
                item.finish("", "cancelled")
                self.release(item)
                continue
            batch.append(item)
            if deadline is None and wait_s > 0:
                deadline = time.monotonic() + wait_s
        return batch

    def drain(self) -> list[Sequence]:
        """Take everything left (shutdown); the caller resolves and releases them."""
        left = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return left
            if item is not None:
                left.append(item)
