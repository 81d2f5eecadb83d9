"""A background response's stream, read back from the store (`GET /responses/{id}?stream=true
&starting_after=N`, and `POST /responses` with `background` and `stream`): the events recorded
past N, then each new one as its run records it, on whichever replica runs it, until its end. So
a client that lost its connection resumes where it was, and sees every event once, in order.

The store is polled (every POLL_S while nothing is new): the run may be on another replica, and
a database's notifications differ between SQLite and PostgreSQL. A comment line every
KEEPALIVE_S while nothing comes keeps proxies from closing the stream and finds a client gone."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

from service.openai.responses.stored import RUNNING, ResponseStore
from service.openai.storage import NotFound

POLL_S = 0.05
KEEPALIVE_S = 15.0
RESTARTED = (
    "the worker running this response stopped; another runs it again from the start: "
    "stream it again from the beginning (starting_after omitted)"
)


def follow(store: ResponseStore, owner: str, response_id: str, after: int) -> Iterator[str]:
    """The events past `after` and those to come, until the response ends (or is cancelled). A
    run taken over by another worker starts its events again: a client that saw some of the old
    run's gets an `error` event saying so, and the stream ends."""
    seen_claim, quiet_since = None, time.monotonic()
    while True:
        try:
            found, status, claim = store.events(owner, response_id, after)
        except NotFound:  # deleted while followed (the first look's 404 is the route's)
            payload = {"type": "error", "sequence_number": after + 1, "code": "not_found", "param": None}
            yield f"event: error\ndata: {json.dumps({**payload, 'message': 'the response was deleted'})}\n\n"
            return
        if seen_claim is not None and claim != seen_claim:
            payload = {"type": "error", "sequence_number": after + 1, "code": "response_restarted"}
            yield f"event: error\ndata: {json.dumps({**payload, 'message': RESTARTED, 'param': None})}\n\n"
            return
        for seq, text in found:
            yield text
            after, seen_claim, quiet_since = seq, claim, time.monotonic()
        if not found:
            if status not in RUNNING:
                return  # its end is written with its last event: nothing more comes
            if time.monotonic() - quiet_since > KEEPALIVE_S:
                yield ": keep-alive\n\n"
                quiet_since = time.monotonic()
            time.sleep(POLL_S)
