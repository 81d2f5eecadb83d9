"""The cap on generate requests in flight (MAX_INFLIGHT_REQUESTS, below THREADS).

Every request being served holds one of gunicorn's THREADS threads, and a generate request holds
its own until its reply (or its stream) ends. Were they all held, every new connection, /health
and /metrics included, would wait in gunicorn's queue behind them: a busy, healthy replica would
fail its liveness probe. So past the cap a generate request is refused at once, 429 `too_busy`
with Retry-After, before its body is read: the threads it leaves free answer the probes and the
refusals, each in about a millisecond, so the queue in front of a probe drains fast.
"""

from __future__ import annotations

import threading

from flask import Flask, Response, g, request

from service.errors import TooBusy
from service.http.auth import require_api_key
from service.http.lookup import batch_line
from service.http.state import app_state

# the routes that run prompts outside GENERATE_BLUEPRINTS: the race page's feed (a stream)
OTHER_ENDPOINTS = frozenset({"page.race"})


class Slot:
    """One request's place under the cap; giving it back twice gives it back once."""

    def __init__(self, gate: InflightGate):
        self._gate: InflightGate | None = gate

    def release(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.leave()


class InflightGate:
    """A counter that never blocks: `try_enter` takes a slot if one is free."""

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError(f"the in-flight limit must be >= 1, got {limit}")
        self.limit = limit
        self._held = 0
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        return self._held

    def try_enter(self) -> Slot | None:
        with self._lock:
            if self._held >= self.limit:
                return None
            self._held += 1
        return Slot(self)

    def leave(self) -> None:
        with self._lock:
            self._held -= 1


# how pydantic reads a true query flag (a background response's `?stream=true`)
TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})


def _runs_prompts(blueprints: set[str], uncapped: frozenset[str]) -> bool:
    # every POST of a generate blueprint runs prompts (their GETs list models or answer 404), but
    # `uncapped`'s: an upload or a new batch is stored and answered at once, its lines run later in
    # the engine's spare room, so a full cap must not refuse it as if it were a generate request
    posted = request.method == "POST" and request.blueprint in blueprints and request.endpoint not in uncapped
    # a background response's events followed hold a thread until it ends, as a stream does
    followed = request.blueprint in blueprints and request.args.get("stream", "").lower() in TRUE
    return posted or followed or request.endpoint in OTHER_ENDPOINTS


def register(app: Flask, limit: int, blueprints: set[str], uncapped: frozenset[str] = frozenset()) -> InflightGate:
    """Gate the generate routes of `blueprints` (and OTHER_ENDPOINTS, but not the endpoints in
    `uncapped`, which run no prompt) at `limit` requests.

    Register it after the hooks that every answer relies on (the request id, the clock that
    times it): a refusal skips the before-request hooks after it. A reply gives its slot back
    when its request is torn down, whatever happened; a stream when the server closes it (it
    ended, failed, or the client went away). Not at its teardown: Flask tears a streamed request
    down as soon as the view has returned, before the first event is sent."""
    gate = InflightGate(limit)
    app_state(app).inflight = gate

    @app.before_request
    def _enter() -> None:
        # a batch line holds none of gunicorn's threads (it runs on the batch runner's own)
        if not _runs_prompts(blueprints, uncapped) or batch_line():
            return
        # Every gated route wants the key (its blueprint's hook, or the race feed's view, asks
        # again, after this app-wide hook). Asked first here: a request the key refuses gets its
        # 401 even while the cap is full, never a 429 that no retry could turn into a 200.
        require_api_key()
        slot = gate.try_enter()
        if slot is None:
            raise TooBusy(
                f"{gate.limit} generate requests are in flight, the most this replica serves at once"
                " (MAX_INFLIGHT_REQUESTS): retry after Retry-After seconds, or on another replica"
            )
        g.inflight_slot = slot

    @app.after_request
    def _hand_to_stream(response: Response) -> Response:
        if response.is_streamed and "inflight_slot" in g:
            response.call_on_close(g.pop("inflight_slot").release)
        return response

    @app.teardown_request
    def _leave(exc: BaseException | None) -> None:
        slot = g.pop("inflight_slot", None)
        if slot is not None:
            slot.release()

    return gate
