"""What both engines share: one thread that owns a model, an inbox (the workload: what is queued
and what is taken), a lifecycle, and the request threads' side of it (submit all or nothing,
wait until ready, drain, stop).

Crash-only: an engine whose load raised, or whose thread dies (an exception its loop did not
expect) or holds work and makes no progress for `settings.stall_s` (a step that never returns:
the watchdog thread sees it), is failed for good. What it holds is answered 503 at once, new work
is refused 503 naming the error, /health turns 503, and the callbacks given to `when_dead` run:
under gunicorn the worker then leaves (gunicorn.conf.py), and its supervisor starts a fresh one,
which loads again. Nothing is restarted in process: a thread stuck in a step cannot be taken
back, and a fresh process is the one state known to be good."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from batcher import admission
from batcher.calibration import Calibration
from batcher.errors import EngineDied, InvalidParams, NeverFits, ShuttingDown
from batcher.lifecycle import Lifecycle
from batcher.metrics import CacheState, Metrics
from batcher.predict import Prediction, StaticCost, VLLMCost, Work
from batcher.sequence import Sequence
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
        self.load_seconds: float | None = None
        self.vocab_size: int | None = None  # set by _load(): token ids a request may name
        self.calibration = Calibration()  # how the cost model's last predictions came out (_finished)
        self._thread = threading.Thread(target=self._main, name=f"{self.name}-engine-thread", daemon=True)
        self._watchdog = threading.Thread(target=self._watch, name=f"{self.name}-watchdog", daemon=True)
        self._beat = time.monotonic()  # the engine thread's last sign of progress (_progressed)
        self._on_death: list[Callable[[str, str], None]] = []

    # the lifecycle's state, as the service and the tests read it
    @property
    def status(self) -> str:
        return self.lifecycle.status

    @property
    def phase(self) -> str:
        return self.lifecycle.phase

    @property
    def error(self) -> str | None:
        return self.lifecycle.error

    @property
    def draining(self) -> bool:
        return self.lifecycle.draining

    @property
    def held_at_drain(self) -> int:
        return self.lifecycle.held_at_drain

    @property
    def abandoned(self) -> int:
        return self.lifecycle.abandoned

    # --- request threads -----------------------------------------------------------------
    def start(self):
        if self.lifecycle.status == "loading" and not self._thread.is_alive():
            self._thread.start()
            self._watchdog.start()
        return self

    def when_dead(self, callback: Callable[[str, str], None]) -> None:
        """`callback(engine name, error)` runs once when the engine fails: its load raised, or it
        died after it was ready (in the thread that found it so); here, at once, if it already
        has (a load can fail before the caller gets to ask)."""
        with self.lifecycle.lock:  # the engine thread fails it under this lock, then reads the list
            if self.lifecycle.phase != "failed":
                self._on_death.append(callback)
                return
        callback(self.name, self.lifecycle.error)

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
        caller waits on each `seq.done`.
        The prediction and the enqueue are one step under the lifecycle's lock, so two requests
        never both count on the same free room. Returns the prediction (also on each sequence)."""
        with self.lifecycle.admitting():
            prediction = self._admission(seqs, max_ttft_s, max_total_s)
            for seq in seqs:
                seq.predicted = prediction
            self.workload.put_all(seqs)
        self.metrics.prompts.labels(self.name).inc(len(seqs))
        return prediction

    def predict(self, new: list[Work], *, alone: bool = False) -> Prediction:
        """When `new` would start, see its first token and end if it were enqueued now: the cost
        model's prediction, with the bound that how its last ones came out puts on it. Idle (or
        `alone`: as if it were), each width at the faster of its clock and the machine profile's:
        an idle engine may doubt what a slow spell taught its clocks, not this machine's speed."""
        running = [] if alone else [admission.work(seq) for seq in self.workload.taken()]
        queued = [] if alone else [admission.work(seq) for seq in self.workload.queued() if not seq.cancelled]
        idle = not running and not queued
        return self.calibration.apply(self.cost.predict(running, queued, new, fastest=idle))

    def begin_drain(self) -> None:
        """Refuse new work (ShuttingDown), let what is queued or taken finish. Non-blocking and
        safe in a signal handler: a short lock, and it wakes the engine thread."""
        self.lifecycle.begin_drain(self.inflight)
        self.workload.wake()  # an idle engine thread looks again and finds itself drained

    def wait_drained(self, timeout: float | None) -> bool:
        """True once nothing is queued or taken (at once for an engine that is not ready)."""
        return not self.lifecycle.ready or self.lifecycle.drained.wait(timeout)

    def _check_token_ids(self, seqs: list[Sequence]) -> None:
        """Token ids only the loaded model can judge; refused before anything is enqueued."""
        if self.vocab_size is None:
            return
        for seq in seqs:
            named = {"logit_bias": [t for t, _ in seq.params.logit_bias], "stop_token_ids": seq.params.stop_token_ids}
            if not isinstance(seq.prompt, str):
                named["prompt"] = seq.prompt
            for param, ids in named.items():
                self.check_token_ids(ids, param)

    def check_token_ids(self, ids, param: str) -> None:
        """InvalidParams naming `param` for an id the loaded model does not have (ids are >= 0:
        the parser has checked that)."""
        if self.vocab_size is None:
            return
        bad = [t for t in ids if t >= self.vocab_size]
        if bad:
            message = f"'{param}' names token id {bad[0]}, outside 0..{self.vocab_size - 1}"
            raise InvalidParams(message, param=param)

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

    def kv_cache(self) -> CacheState | None:
        """(fraction of the KV cache in use, tokens per block, blocks) for /metrics' GIE gauges;
        None: nothing to say (not loaded)."""
        return None

    def running(self) -> int:
        """Sequences the engine has taken from its queue and not yet resolved."""
        return self.workload.running()

    def inflight(self) -> int:
        """Sequences queued or taken."""
        return self.workload.inflight()

    def load(self, prompts: int, max_tokens: int) -> dict:
        """/load's entry: the prediction for `prompts` prompts of `max_tokens` tokens (null
        fields when unknown or not ready) and the estimates it is made of."""
        ready = self.lifecycle.ready
        prediction = self.predict([Work(max_tokens)] * prompts) if ready else None
        return {
            "status": self.lifecycle.status,
            "prompts": prompts,
            "max_tokens": max_tokens,
            **(prediction or Prediction(None, None, None, self.inflight())).shown(),
            "estimates": {**self.cost.shown(), "calibration": self.calibration.shown()},
        }

    def health(self) -> dict:
        return {
            "status": self.lifecycle.status,
            "error": self.lifecycle.error,
            "load_seconds": self.load_seconds,
            "phase": self.lifecycle.phase,
            "phase_seconds": {k: round(v, 2) for k, v in self.lifecycle.phase_seconds.items()},
            "queued": self.workload.qsize(),
            "running": self.running(),
            "inflight": self.inflight(),
            "stalled_s": round(self.stalled_s(), 1),  # with work held, since the last progress
            "settings": self.settings.shown(),
        }

    def check_admission(
        self, seqs: list[Sequence], *, max_ttft_s: float | None = None, max_total_s: float | None = None
    ) -> Prediction:
        """What `submit()` would raise for `seqs` now (ShuttingDown, NotReady, InvalidParams,
        WaitTooLong), and its prediction, with nothing enqueued: a request thread asks before
        work that only an admitted request needs (compiling its grammar). `submit()` decides."""
        with self.lifecycle.admitting():
            return self._admission(seqs, max_ttft_s, max_total_s)

    def _admission(self, seqs: list[Sequence], max_ttft_s: float | None, max_total_s: float | None) -> Prediction:
        """Under the lifecycle's lock: the prediction for `seqs`, or what refuses them. Refused
        (WaitTooLong) if the predicted time to the first token (its 90th percentile) exceeds
        `max_ttft_s`, or the predicted completion `max_total_s`, idle engine or not. An idle
        engine prices at the faster of its clocks and the machine profile (`predict(alone=True)`):
        its clocks may remember a slow spell that only admitted work would correct. What even
        that cannot finish in `max_total_s` is NeverFits where a profile backs the price;
        without one, a 429 until the clocks forget. An unknown prediction admits up to
        `unmeasured_room`."""
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
        room = self.cost.unmeasured_room(self.workload.running(), self.workload.qsize())
        admission.within_limits(self.name, prediction, max_ttft_s, max_total_s, room - len(seqs))
        return prediction

    # --- the engine thread ---------------------------------------------------------------
    def _enter_phase(self, phase: str) -> None:
        """Called from the engine thread as its start moves on (loading -> compiling)."""
        if self.lifecycle.advance(phase):
            log.info("%s engine: %s", self.name, phase)

    def _main(self) -> None:
        started = time.perf_counter()
        self.lifecycle.begin_loading()
        try:
            self._load()
        except Exception as exc:  # crash-only: a fresh process loads again (when_dead's callbacks)
            log.exception("%s engine failed to start", self.name)
            error = f"{type(exc).__name__}: {exc}"
            if self.lifecycle.advance("failed", error):  # not once stopped: the process leaves anyway
                self._dead(error)
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
            self._die(f"the engine thread died: {type(exc).__name__}: {exc}")

    # --- crash-only: death, and the watchdog that finds a stall -------------------------------
    def _progressed(self) -> None:
        """The engine thread made progress (a turn of its loop that did work, a step, a round)."""
        self._beat = time.monotonic()

    def stalled_s(self) -> float:
        """Seconds the engine has held work without progress (0 while idle). Progress: the
        engine thread's last beat, a token of any sequence it took; the oldest queued sequence's
        arrival stands for the moment it last had nothing to do, so an engine that was idle for
        an hour is not stalled the instant a request comes."""
        taken, queued = self.workload.taken(), self.workload.queued()
        if not taken and not queued:
            return 0.0
        signs = [self._beat, *(s.last_token_at or s.started_at or s.created_at for s in taken)]
        signs += [s.created_at for s in queued[:1]]
        return max(0.0, time.monotonic() - max(signs))

    def _watch(self) -> None:
        """The watchdog thread: fails a ready engine that holds work and makes no progress."""
        every = min(1.0, self.settings.stall_s / 4)
        while not self.lifecycle.stopping.wait(every):
            if self.lifecycle.died:
                return
            stalled = self.stalled_s() if self.lifecycle.ready else 0.0
            if stalled > self.settings.stall_s:
                log.error("%s engine: no progress for %.1fs with work held", self.name, stalled)
                self._die(f"no progress for {stalled:.0f}s (ENGINE_STALL_S {self.settings.stall_s:g})")

    def _die(self, error: str) -> None:
        """Failed for good: what is held answered 503 at once, the death callbacks run."""
        if not self.lifecycle.die(error):
            return
        died = EngineDied(f"the {self.name} engine failed: {error}")
        held = self.workload.taken() + self.workload.drain()
        for seq in held:
            self.workload.release(seq)
            seq.fail(died)
        log.error("%s engine failed: %s; %d sequences answered 503", self.name, error, len(held))
        self._dead(error)

    def _dead(self, error: str) -> None:
        """Failed for good (at its load or later): the death callbacks run, each once."""
        for callback in self._on_death:
            try:
                callback(self.name, error)
            except Exception:
                log.exception("%s engine: a death callback failed", self.name)

    def _note_if_drained(self) -> None:
        """Engine thread, between rounds or steps."""
        self.lifecycle.note_drained(self.inflight)

    def _finished(self, seq: Sequence) -> None:
        """Engine thread, after `seq.finish()`: the metrics of a sequence that ran, and how its
        predicted first token came out."""
        if seq.error is None and seq.finish_reason != "cancelled":
            self.metrics.finished(self.name, seq)
        if seq.predicted is not None and seq.ttft_s is not None:  # however it ended, its first token came
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
        pass
