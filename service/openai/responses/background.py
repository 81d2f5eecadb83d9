"""Background responses (`background: true`): the request is answered at once, `queued`, and a
worker runs it. One thread per worker process claims queued ones (stored.py `claim`) for the
engines that can serve now and runs each on a thread of its own, as an interactive request runs
(the same admission and priority, not the batch lane), recording every event of its stream in
order, so that `GET /responses/{id}?stream=true&starting_after=N` replays and follows it from any
replica. The run's end is written with its last event in one transaction.

Nothing is lost to a crash: a run whose worker dies (its heartbeat, the batch runner's, goes
stale) is claimed by a live worker and runs again from the start (its events so far dropped), and
only the run holding the claim writes, so it ends once. A cancel or a delete takes the claim
away: the run stops at its next event. An engine that cannot take it now (429, 503) hands it back."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable

from batcher.errors import EngineError
from batcher.sequence import Priority
from service import errors
from service.errors import ApiError
from service.generation import Engine, Run
from service.openai import fields
from service.openai.responses import serving
from service.openai.responses.protocol import Responses
from service.openai.responses.stored import Job, ResponseStore
from service.plan import Served
from service.turns import Turns

log = logging.getLogger(__name__)

TURN_S = 0.5  # the longest the thread sleeps between looks for queued responses; a new one wakes it
AT_ONCE = 16  # runs in flight in one worker: each waits in its engine's queue as a request does
RETRY = {429, 503}  # the engine is full or not serving now: back to queued


class Background(Turns):
    def __init__(self, store: ResponseStore, worker: str, served: Callable[[], Served], engines: dict[str, Engine]):
        """`worker`: this process's id in the heartbeats; `served`: the settings and tokenizer."""
        super().__init__("background-responses", TURN_S, AT_ONCE)
        self.store, self.worker, self.served, self.engines = store, worker, served, engines
        self._in_flight = 0
        self._lock = threading.Lock()

    def _turn(self) -> None:
        ready = [name for name, engine in self.engines.items() if _available(engine)]
        while ready and not self._stop.is_set():
            with self._lock:
                if self._in_flight >= AT_ONCE:
                    return
            job = self.store.claim(self.worker, ready)
            if job is None:
                return
            with self._lock:
                self._in_flight += 1
            log.info("response %s: running on the %s engine", job.id, job.engine)
            self._pool.submit(self._run, job)

    def _run(self, job: Job) -> None:
        try:
            self._events(job)
        except (ApiError, EngineError) as exc:
            status, code = errors.describe(exc)
            if status in RETRY:
                self.store.release(job)
                log.info("response %s: back to queued (%s)", job.id, exc)
            else:
                self._fail(job, code, errors.message(exc))
        except Exception:
            log.exception("response %s: its run failed", job.id)
            self._fail(job, "internal_error", "the service failed to run this response")
        finally:
            with self._lock:
                self._in_flight -= 1
            self.kick()

    def _events(self, job: Job) -> None:
        """The turn, as its request asked, its events recorded as they come."""
        served = self.served()
        req = fields.parse(job.body, Responses, "responses", served.config)
        history = self.store.history(job.owner, req.previous_response_id) if req.previous_response_id else []
        plan = serving.prepare(req, served, history)
        ended: list[dict] = []  # the response once done: written with the last event
        # an interactive request's way to its engine, without a request's deadline header
        run = Run(self.engines[job.engine], served.config.request_timeout_s, None, served.config, Priority.INTERACTIVE)
        stream = serving.stream(run, plan, {**job.response, "status": "in_progress"}, ended.append)
        try:
            for seq, text in enumerate(stream):
                if not self.store.record(job, seq, text, ended[0] if ended else None):
                    log.info("response %s: stopped (cancelled, deleted or taken over)", job.id)
                    return
                if not ended and text.startswith("event: error\n"):
                    if self._stop.is_set():  # the drain cut it: another worker runs it again
                        self.store.release(job)
                        return
                    error = json.loads(text.split("data: ", 1)[1])
                    self._fail(job, error.get("code") or "error", error.get("message") or "", seq + 1)
                    return
        finally:
            stream.close()

    def _fail(self, job: Job, code: str, message: str, seq: int | None = None) -> None:
        """The run's end as `failed`, with its error (and an `error` event where none was sent)."""
        end = {**job.response, "status": "failed", "error": {"code": code, "message": message}}
        if seq is None:
            seq = len(self.store.events(job.owner, job.id, -1)[0])
            payload = {"type": "error", "sequence_number": seq, "code": code, "message": message, "param": None}
            text = f"event: error\ndata: {json.dumps(payload)}\n\n"
            self.store.record(job, seq, text)
            seq += 1
        payload = {"type": "response.failed", "sequence_number": seq, "response": end}
        self.store.record(job, seq, f"event: response.failed\ndata: {json.dumps(payload)}\n\n", end)


def _available(engine) -> bool:
    try:
        engine.check_available()
    except EngineError:
        return False
    return True
