"""What both engines share: one thread that owns a model, an inbox (the workload: what is queued
and what is taken), a lifecycle, and the request threads' side of it. A request's way: `submit`
adds its sequences, all or none, once `_admission` admits them; the engine thread serves them
(`_serve`). Crash-only: its watchdog (batcher/watchdog.py) fails an engine that dies or stalls."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from batcher import admission
from batcher.calibration import Calibration
from batcher.errors import InvalidParams, NeverFits, ShuttingDown
from batcher.lifecycle import Lifecycle
from batcher.metrics import CacheState, Metrics
from batcher.predict import Prediction, StaticCost, VLLMCost, Work
from batcher.sequence import Priority, Sequence
from batcher.watchdog import Watchdog
from batcher.workload import Workload

log = logging.getLogger(__name__)


class EngineThread:
    """Subclasses give `_load()` (build the model, in the engine's own thread), `_serve()` (the
    loop, until `self.lifecycle.stopping` is set) and may give `_abandon()` (called by `stop()`).
    `settings`: the engine's slice of Config (batcher/settings.py)."""

    name = "engine"
    cost: StaticCost | VLLMCost  # the engine's cost model (batcher/predict.py), fed by its thread

    def __init__(self, settings, *, max_queue: int, metrics: Metrics | None, enabled=True, why_disabled=""):
        self.settings = settings
        self.workload = Workload(max_queue)
        self.metrics = metrics or Metrics()
        self.metrics.watch(self.name, self.running, self.workload.qsize, self.kv_cache)
        self.lifecycle = Lifecycle(self.name, enabled=enabled, why_disabled=why_disabled)
        self.watchdog = Watchdog(self.name, self.lifecycle, self.workload, settings.stall_s)
        self.load_seconds: float | None = None
        self.vocab_size: int | None = None  # set by _load(): token ids a request may name
        self.calibration = Calibration()  # how its last predictions of interactive work came out (_finished)
        self._thread = threading.Thread(target=self._main, name=f"{self.name}-engine-thread", daemon=True)

    # --- what the service reads (its /health and /load bodies: service/ops/health.py) ----
    status = property(lambda self: self.lifecycle.status)
    phase = property(lambda self: self.lifecycle.phase)
    error = property(lambda self: self.lifecycle.error)
    ready = property(lambda self: self.lifecycle.ready)
    draining = property(lambda self: self.lifecycle.draining)
    held_at_drain = property(lambda self: self.lifecycle.held_at_drain)
    abandoned = property(lambda self: self.lifecycle.abandoned)

    def phase_seconds(self) -> dict[str, float]:
        return dict(self.lifecycle.phase_seconds)  # each phase of the start so far

    def queued(self) -> int:
        return self.workload.qsize()  # sequences waiting, not yet taken

    def running(self) -> int:
        return self.workload.running()  # taken from the queue, not yet resolved

    def inflight(self) -> int:
        return self.workload.inflight()  # queued or taken

    def stalled_s(self) -> float:
        """Seconds the engine has held work without progress (0 while idle): batcher/watchdog.py."""
        return self.watchdog.stalled_s()

    def details(self) -> dict:
        """What only this kind of engine has to show (its own counters), after the shared fields."""
        return {}

    def kv_cache(self) -> CacheState | None:
        """(KV cache fraction in use, tokens per block, blocks) for /metrics' GIE gauges; None: not loaded."""
        return None

    # --- request threads: start, add, admit ----------------------------------------------
    def start(self):
        if self.lifecycle.status == "loading" and not self._thread.is_alive():
            self._thread.start()
            self.watchdog.start()
        return self

    def when_dead(self, callback: Callable[[str, str], None]) -> None:
        """`callback(engine name, error)` runs once when the engine fails (Watchdog.when_dead)."""
        self.watchdog.when_dead(callback)

    def wait_ready(self, timeout: float | None = None) -> bool:
        self.lifecycle.settled.wait(timeout)
        return self.lifecycle.ready

    def check_available(self) -> None:
        """Raise what `submit()` would raise for any request: ShuttingDown or NotReady."""
        self.lifecycle.check_available()

    def submit(
        self, seqs: list[Sequence], *, max_ttft_s: float | None = None, max_total_s: float | None = None
    ) -> Prediction:
        """Enqueue all of `seqs` or none (NeverFits, QueueFull, WaitTooLong: `_admission`); the
        caller waits on each `seq.done`. The prediction and the enqueue are one step under the
        lifecycle's lock, so two requests never both count on the same free room. Returns the
        prediction (also on each sequence)."""
        with self.lifecycle.admitting():
            prediction = self._admission(seqs, max_ttft_s, max_total_s)
            for seq in seqs:
                seq.predicted = prediction
            self.workload.put_all(seqs)
        self.metrics.prompts.labels(self.name).inc(len(seqs))
        return prediction

    def check_admission(
        self, seqs: list[Sequence], *, max_ttft_s: float | None = None, max_total_s: float | None = None
    ) -> Prediction:
        """What `submit()` would raise for `seqs` now, and its prediction, with nothing enqueued:
        asked before work only an admitted request needs (its grammar). `submit()` decides."""
        with self.lifecycle.admitting():
            return self._admission(seqs, max_ttft_s, max_total_s)

    def _admission(self, seqs: list[Sequence], max_ttft_s: float | None, max_total_s: float | None) -> Prediction:
        """Under the lifecycle's lock: the prediction for `seqs`, or what refuses them. Refused
        (WaitTooLong) if the predicted time to the first token (its 90th percentile) exceeds
        `max_ttft_s`, or the predicted completion `max_total_s`, idle engine or not. An idle
        engine prices at the faster of its clocks and the machine profile (`predict(alone=True)`):
        its clocks may remember a slow spell that only admitted work would correct. What even
        that cannot finish in `max_total_s` is NeverFits where a profile backs the price; without
        one, a 429 until the clocks forget. An unknown prediction admits up to `unmeasured_room`.
        Batch work queued runs after an interactive request: not counted for it (`predict`)."""
        self._check_token_ids(seqs)
        if len(seqs) > self.workload.maxsize:  # no retry can make room for it: not a 429
            message = f"{len(seqs)} sequences (prompts x n); the {self.name} engine's queue holds"
            raise NeverFits(f"{message} at most {self.workload.maxsize}")
        new, idle = [admission.work(seq) for seq in seqs], not self.workload.inflight()
        if idle or self.cost.has_prior:
            alone = self.predict(new, alone=True)
            admission.fits_alone(self.name, alone, max_total_s, self.cost.has_prior, self.cost.forgets_in())
            if idle:
                admission.within_limits(self.name, alone, max_ttft_s, None, 0)  # the client's own deadline still holds
                return alone
        prediction = self.predict(new)
        room = self.cost.unmeasured_room(self.workload.running(), self.workload.qsize(admission.urgency(new)))
        admission.within_limits(self.name, prediction, max_ttft_s, max_total_s, room - len(seqs))
        return prediction

    def predict(self, new: list[Work], *, alone: bool = False) -> Prediction:
        """When `new` would start, see its first token and end if it were enqueued now: the cost
        model's prediction, with the bound that how its last ones came out puts on it. Idle (or
        `alone`: as if it were), each width at the faster of its clock and the machine profile's:
        an idle engine may doubt what a slow spell taught its clocks, not this machine's speed."""
        running = [] if alone else [admission.work(seq) for seq in self.workload.taken()]
        queued = [] if alone else admission.ahead(self.workload.queued(), new)
        idle = not running and not queued
        return self.calibration.apply(self.cost.predict(running, queued, new, fastest=idle))

    def _check_token_ids(self, seqs: list[Sequence]) -> None:
        """Token ids only the loaded model can judge; refused before anything is enqueued."""
        for seq in seqs:
            self.check_token_ids([t for t, _ in seq.params.logit_bias], "logit_bias")
            self.check_token_ids(seq.params.stop_token_ids, "stop_token_ids")
            if not isinstance(seq.prompt, str):
                self.check_token_ids(seq.prompt, "prompt")

    def check_token_ids(self, ids, param: str) -> None:
        """InvalidParams naming `param` for an id the loaded model lacks (ids are >= 0: parsed)."""
        if self.vocab_size is None:
            return
        bad = [t for t in ids if t >= self.vocab_size]
        if bad:
            message = f"'{param}' names token id {bad[0]}, outside 0..{self.vocab_size - 1}"
            raise InvalidParams(message, param=param)

    # --- the engine thread: load, then serve ------------------------------------------------
    def _main(self) -> None:
        started = time.perf_counter()
        self.lifecycle.begin_loading()
        try:
            self._load()
        except Exception as exc:  # crash-only: a fresh process loads again (when_dead's callbacks)
            log.exception("%s engine failed to start", self.name)
            error = f"{type(exc).__name__}: {exc}"
            if self.lifecycle.advance("failed", error):  # not once stopped: the process leaves anyway
                self.watchdog.dead(error)
            return
        self.load_seconds = time.perf_counter() - started
        if not self.lifecycle.advance("ready"):
            log.info("%s engine loaded in %.1fs, after it was stopped", self.name, self.load_seconds)
            return
        log.info("%s engine ready in %.1fs %s", self.name, self.load_seconds, self.lifecycle.phase_seconds)
        try:
            self._serve()
        except BaseException as exc:  # noqa: BLE001 - whatever ends the loop ends the engine
            log.exception("%s engine thread died", self.name)
            self.watchdog.die(f"the engine thread died: {type(exc).__name__}: {exc}")

    def _enter_phase(self, phase: str) -> None:
        """Called from the engine thread as its start moves on (loading -> compiling)."""
        if self.lifecycle.advance(phase):
            log.info("%s engine: %s", self.name, phase)

    def _progressed(self) -> None:
        """The engine thread made progress (a turn of its loop that did work, a step, a round)."""
        self.watchdog.beat()

    def _note_if_drained(self) -> None:
        """Engine thread, between rounds or steps."""
        self.lifecycle.note_drained(self.inflight)

    def _finished(self, seq: Sequence) -> None:
        """Engine thread, after `seq.finish()`: its metrics if it ran; how its predicted first token came."""
        if seq.error is None and seq.finish_reason != "cancelled":
            self.metrics.finished(self.name, seq)
        if seq.predicted is not None and seq.ttft_s is not None and seq.priority == Priority.INTERACTIVE:
            self.calibration.observe(seq.predicted.ttft_s, seq.ttft_s)

    def _fail_waiting(self, message: str) -> None:
        for seq in self.workload.drain():
            self.lifecycle.abandon()
            seq.fail(ShuttingDown(message))

    def _load(self) -> None:
        raise NotImplementedError

    def _serve(self) -> None:
        raise NotImplementedError

    def _abandon(self) -> None:
        """What is taken, told to stop (by `stop()`); nothing to tell by default."""

    # --- the end: drain, stop ------------------------------------------------------------
    def begin_drain(self) -> None:
        """Refuse new work (ShuttingDown), let what is queued or taken finish. Non-blocking and
        safe in a signal handler: a short lock, and it wakes the engine thread."""
        self.lifecycle.begin_drain(self.inflight)
        self.workload.wake()  # an idle engine thread looks again and finds itself drained

    def wait_drained(self, timeout: float | None) -> bool:
        """True once nothing is queued or taken (at once for an engine that is not ready)."""
        return not self.lifecycle.ready or self.lifecycle.drained.wait(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """Take no more work, abandon what is taken, fail what waits (503), join the thread.
        With timeout 0 it only starts the shutdown (safe in a signal handler). A dead engine's
        thread is not waited for: it may be stuck for good."""
        died = self.lifecycle.died
        self.lifecycle.stop()
        self._abandon()
        self.workload.wake()
        if self._thread.is_alive() and not died:
            self._thread.join(timeout)
