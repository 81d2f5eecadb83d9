"""The request's id: the client's `X-Request-Id` when it is a sane one, else a fresh one; set
before any other hook runs, in every log line about the request, and echoed back in the
response's `X-Request-Id` on every route. The OpenAI replies' own `id` fields are not it."""

from __future__ import annotations

import re
import uuid

from flask import Flask, g, has_request_context, request

HEADER = "X-Request-Id"
MAX_LENGTH = 128
# visible ASCII only: no spaces (log lines are space-separated), no control characters
_SANE = re.compile(rf"[\x21-\x7e]{{1,{MAX_LENGTH}}}")


def of(header: str | None) -> str:
    """The client's id if it is 1..MAX_LENGTH visible ASCII characters, else a new one."""
    return header if header is not None and _SANE.fullmatch(header) else uuid.uuid4().hex


def current() -> str:
    """The id of the request being served ("-" outside one)."""
    return g.get("request_id", "-") if has_request_context() else "-"


def register(app: Flask) -> None:
    """Before the app's other hooks, and so before every blueprint's (auth, engine availability),
    which may answer the request themselves."""

    @app.before_request
    def _assign() -> None:
        g.request_id = of(request.headers.get(HEADER))

    @app.after_request
    def _echo(response):
        response.headers[HEADER] = current()
        return response
