"""The race page's feed: one engine's N prompts, sent the chosen way, as one event stream.

Each prompt goes through a real generate route of this app, so parsing, auth, the batching and
every error are the service's own; the feed only multiplexes the replies, tagging each event
with the prompt's `index` and `t_ms`, milliseconds since the race began (one clock for all rows).

- `concurrent`: N single-prompt requests to /generate_stream (or /generate_vllm_stream) with
  `details`, each from its own thread, as N clients would send them.
- `batch`: one request to /generate (or /generate_vllm) carrying the N prompts, with `details`.

Why here and not N fetches from the page: a browser opens at most 6 HTTP/1.1 connections to one
origin (Chromium and Firefox), so 16 or 64 concurrent streams from a page would run 6 at a time
and the race would show the browser's limit, not the batchers'. The requests are dispatched
through the WSGI app in this process (werkzeug's `Client`, no socket), each in its own thread as
a gunicorn thread would run it.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Iterator

from flask import Flask
from werkzeug.test import Client

PATHS = {  # engine -> (streaming route, one-request route)
    "static": ("/generate_stream", "/generate"),
    "vllm": ("/generate_vllm_stream", "/generate_vllm"),
}
MODES = ("concurrent", "batch")


def _sse_payloads(response) -> Iterator[dict]:
    """The `data:` payloads of a streamed reply, as they arrive."""
    buffer = ""
    for chunk in response.response:
        buffer += chunk.decode() if isinstance(chunk, bytes) else chunk
        while "\n\n" in buffer:
            event, buffer = buffer.split("\n\n", 1)
            if event.startswith("data: "):
                yield json.loads(event.removeprefix("data: "))


def _error(response) -> dict:
    try:
        body = json.loads(response.get_data(as_text=True))
    except ValueError:
        body = {"error": response.status, "type": "http_error"}
    return {"error": body.get("error"), "type": body.get("type"), "status": response.status_code}


class Race:
    """One engine's run of `prompts`; iterate it for the SSE lines of the feed."""

    def __init__(self, app: Flask, engine: str, mode: str, prompts: list[str], params: dict, headers: dict):
        self.app, self.prompts, self.params, self.headers = app, prompts, params, headers
        self.stream_path, self.batch_path = PATHS[engine]
        self.mode = mode
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._t0 = time.monotonic()

    def _put(self, index: int, payload: dict | None) -> None:
        t_ms = round((time.monotonic() - self._t0) * 1000, 1)
        self._events.put(None if payload is None else {"index": index, "t_ms": t_ms, **payload})

    def _one_stream(self, index: int) -> None:
        self._put(index, {"sent": True})
        body = {"prompt": self.prompts[index], **self.params, "details": True}
        response = Client(self.app).post(self.stream_path, json=body, headers=self.headers, buffered=False)
        try:
            if response.status_code != 200:
                self._put(index, _error(response))
                return
            for payload in _sse_payloads(response):
                self._put(index, payload)
                if self._stopping.is_set():  # the page left: closing the reply cancels the sequence
                    return
        finally:
            response.close()

    def _one_request(self) -> None:
        for index in range(len(self.prompts)):
            self._put(index, {"sent": True})
        body = {"prompts": self.prompts, **self.params, "details": True}
        response = Client(self.app).post(self.batch_path, json=body, headers=self.headers)
        if response.status_code != 200:
            for index in range(len(self.prompts)):
                self._put(index, _error(response))
            return
        for index, detail in enumerate(response.get_json()["details"]):
            self._put(index, {**detail, "done": True})

    def _guarded(self, work, index: int) -> None:
        try:
            work()
        except Exception as exc:  # a failed dispatch ends its own rows, never the feed
            self._put(index, {"error": f"{type(exc).__name__}: {exc}", "type": "internal_error", "status": 500})
        finally:
            self._put(index, None)

    def __iter__(self) -> Iterator[str]:
        if self.mode == "batch":
            works = [(self._one_request, 0)]
        else:
            works = [(lambda i=i: self._one_stream(i), i) for i in range(len(self.prompts))]
        for work, index in works:
            threading.Thread(target=self._guarded, args=(work, index), name="race", daemon=True).start()
        open_ = len(works)
        try:
            while open_:
                event = self._events.get()
                if event is None:
                    open_ -= 1
                    continue
                yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
            yield f"data: {json.dumps({'race_done': True})}\n\n"
        finally:
            self._stopping.set()
