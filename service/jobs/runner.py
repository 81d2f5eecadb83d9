"""The batch runner: one thread per worker process that moves batches through OpenAI's states.

Each turn it beats its heartbeat, reads new batches' files (validating -> in_progress, or failed
with the file's faults), ends what is cancelled, expired or done (finalizing -> cancelled,
expired, completed, with the output and error files), and hands each in_progress batch's lines to
its engine as far as there is spare room: none while anything waits in that engine's queue, at
most a round's worth of its own in flight (BATCH_SIZE) while interactive work runs there, and on
vLLM half of VLLM_MAX_NUM_SEQS once it has been quiet for QUIET_S (`batch_width`). A line runs
through the app itself, on the route its batch names under its base URL, so its answer is the
online route's, byte for byte; a refusal that a retry can turn (429, 503) hands the line back for
later.

Nothing is lost to a crash: each result is recorded as it completes (lines.py), a dead worker's
claims go back once its heartbeat is stale, and a batch's end is one transaction (store.py)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid

from flask import Flask

from batcher.engine import EngineThread
from service.config import Config
from service.jobs import input_file
from service.jobs.lines import STALE_S, Lines
from service.jobs.store import BatchRecord, Store
from service.turns import Turns

log = logging.getLogger(__name__)

TURN_S = 0.5  # the longest a runner sleeps between turns; a finished line or a new batch wakes it
PREFIXES = {"vllm": "/v1", "static": "/static/v1"}  # the engine a batch runs on, by its base URL
QUIET_S = 1.0  # interactive work gone this long: a lull between a client's requests is not spare room
RETRY = {429, 503}  # busy, or not serving now: the line goes back, another turn tries again
# The WSGI environ key that marks a batch line's request (set on the app's own test client): an
# environ key, not a header, so that no HTTP client can forge it (service/http/lookup.py reads it)
BATCH_LINE = "service.batch_line"
NO_STREAM = {"code": "invalid_request", "message": "'stream' is not supported in a batch", "param": "stream"}


def batch_width(engine: str, config: Config, *, quiet_s: float) -> int:
    """The most lines of ours an engine runs at once. While interactive work runs there (or ran
    within QUIET_S), a round's worth, BATCH_SIZE, on either engine: on vLLM each line's prefill
    shares an interactive request's step, so half its slots of batch lines slowed interactive
    first tokens well past what a round's worth does (docs/performance.md). Once quiet, static keeps a
    round; vLLM takes half its slots, since its priority preempts for KV cache blocks, not for a
    slot: the other half stays free for the next interactive request."""
    busy = config.batch_size
    if engine == "static":
        return busy
    full = max(1, config.vllm_max_num_seqs // 2)
    return min(busy, full) if quiet_s < QUIET_S else full


class BatchRunner(Turns):
    def __init__(self, app: Flask, store: Store, config: Config, engines: dict[str, EngineThread]):
        """`app`: what runs each line (its own test client); `engines`: each line's room."""
        super().__init__("batch-runner", TURN_S, config.batch_size + config.vllm_max_num_seqs)  # both rooms, full
        self.app, self.store, self.config, self.engines = app, store, config, engines
        self.lines = Lines(store.db)
        self.worker = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._in_flight = dict.fromkeys(PREFIXES, 0)  # lines of ours in each engine now
        self._lock = threading.Lock()

    def wait_for(self, batch_id: str, statuses: set[str], timeout: float) -> BatchRecord | None:
        """The batch once it is in one of `statuses`, or None at the timeout (tests, the bench)."""
        deadline = time.monotonic() + timeout
        with self._turned:
            while True:
                batch = self.store.batch(None, batch_id)
                if batch is not None and batch.status in statuses:
                    return batch
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return None
                self._turned.wait(left)

    # --- the runner's thread ----------------------------------------------------------------
    def _turn(self) -> None:
        self.lines.heartbeat(self.worker)
        for batch in self.store.batches_in("validating"):
            self._validate(batch)
        for batch in self.store.batches_in("in_progress", "cancelling", "finalizing"):
            if batch.status == "finalizing":
                self._resume_finalizing(batch)
            elif batch.status == "cancelling":
                if not self._holds_lines(batch) and not self.lines.running_elsewhere(batch.id):
                    self._finish(batch, "cancelled", "batch_cancelled")
            elif time.time() >= batch.expires_at:
                self._finish(batch, "expired", "batch_expired")  # what finished stays; the rest is an error
            elif self.lines.open_count(batch.id) == 0:
                self._finish(batch, "completed", None)
            else:
                self._dispatch(batch)

    def _validate(self, batch: BatchRecord) -> None:
        content = self.store.content(batch.owner, batch.input_file_id)
        if self.engines[batch.engine].status == "disabled":
            return  # another replica's to run (this one refuses such a batch at its creation)
        if content is None:
            faults = [{"code": "file_not_found", "message": "the input file was deleted", "param": "input_file_id"}]
        else:
            requests, faults = input_file.read(content, batch.endpoint, self.config.max_batch_lines)
        if faults:
            self.store.move(batch.id, "failed", only_from=("validating",), errors=faults)
            return
        self.lines.add(batch.id, requests)
        self.store.move(batch.id, "in_progress", only_from=("validating",))

    def _room(self, engine: str) -> int:
        """How many more of our lines the engine takes now: none while anything waits in its queue."""
        eng = self.engines[engine]
        if not eng.ready or eng.draining or eng.queued() > 0:
            return 0
        limit = batch_width(engine, self.config, quiet_s=eng.workload.interactive_quiet_s())
        with self._lock:
            return max(0, limit - self._in_flight[engine])

    def _holds_lines(self, batch: BatchRecord) -> bool:
        with self._lock:
            return self._in_flight[batch.engine] > 0

    def _dispatch(self, batch: BatchRecord) -> None:
        room = self._room(batch.engine)
        if room <= 0:
            return
        claim, taken = self.lines.claim(batch.id, self.worker, room)
        for line_no, _, body in taken:
            with self._lock:
                self._in_flight[batch.engine] += 1
            self._pool.submit(self._run_line, batch, claim, line_no, body)

    def _run_line(self, batch: BatchRecord, claim: str, line_no: int, body: dict) -> None:
        try:
            if body.get("stream"):
                self.lines.record(batch.id, line_no, claim, None, None, NO_STREAM)
                return
            path = PREFIXES[batch.engine] + batch.endpoint.removeprefix("/v1")
            headers = {"X-Request-Id": f"{batch.id}-{line_no}"}
            if self.config.api_keys:  # the route wants a key; any of the service's own does
                headers["Authorization"] = f"Bearer {self.config.api_keys[0]}"
            # marked in the environ, which no HTTP client can set: the line runs at the lowest priority
            reply = self.app.test_client().post(path, json=body, headers=headers, environ_overrides={BATCH_LINE: True})
            if reply.status_code in RETRY:
                self.lines.release(batch.id, line_no, claim)
                return
            answer = reply.get_json(silent=True)
            self.lines.record(batch.id, line_no, claim, reply.status_code, reply.headers.get("X-Request-Id"), answer)
        except Exception:  # recorded as an error: a line that breaks the runner must not loop
            log.exception("batch %s: line %d failed in the runner", batch.id, line_no)
            error = {"code": "internal_error", "message": "the service failed to run this request"}
            self.lines.record(batch.id, line_no, claim, None, None, error)
        finally:
            with self._lock:
                self._in_flight[batch.engine] -= 1
            self.kick()

    def _finish(self, batch: BatchRecord, status: str, unfinished: str | None) -> None:
        if self.store.move(batch.id, "finalizing", only_from=(batch.status,)):
            output, errors = self.lines.results(batch.id, unfinished)
            self.store.finish(self.store.batch(None, batch.id), status, output, errors)

    def _resume_finalizing(self, batch: BatchRecord) -> None:
        """A batch left finalizing by a worker that died in its last transaction: end it again."""
        if batch.finalizing_at is None or time.time() - batch.finalizing_at < STALE_S:
            return
        if batch.cancelling_at is not None:
            status, unfinished = "cancelled", "batch_cancelled"
        elif self.lines.open_count(batch.id):
            status, unfinished = "expired", "batch_expired"
        else:
            status, unfinished = "completed", None
        output, errors = self.lines.results(batch.id, unfinished)
        self.store.finish(batch, status, output, errors)
