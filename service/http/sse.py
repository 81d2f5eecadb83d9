"""Server-sent events: how every stream of this service is framed (the demo streams, the race
feed, OpenAI's chunks), written once."""

from __future__ import annotations

import json
from collections.abc import Iterator

from flask import Response, stream_with_context

# a proxy in front (nginx) must pass each event on as it comes, not buffer the reply
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event(payload: dict | str) -> str:
    """One `data:` event: a JSON object, or a string as it is (OpenAI's `[DONE]`)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


def response(events: Iterator[str]) -> Response:
    """The streamed reply; closing it (the client went away) closes `events`."""
    return Response(stream_with_context(events), mimetype="text/event-stream", headers=HEADERS)
