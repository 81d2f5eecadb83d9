"""One place that turns exceptions into JSON errors, in two shapes: the demo routes'
{"error": "...", "type": "..."} and OpenAI's {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import logging

from flask import Blueprint, Flask, Response, jsonify
from werkzeug.exceptions import HTTPException

from batcher.errors import (
    EngineDied,
    EngineError,
    InvalidParams,
    NeverFits,
    NotReady,
    QueueFull,
    RoundFailed,
    RowFailed,
    ShuttingDown,
    WaitTooLong,
)
from service.http import request_id

log = logging.getLogger(__name__)


class ApiError(Exception):
    status = 400
    type = "bad_request"

    def __init__(self, message: str, *, status: int | None = None, type: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status = status or self.status
        self.type = type or self.type
        self.param = param  # the request field at fault, where there is one (OpenAI's "param")


class InvalidJson(ApiError):
    status, type = 400, "invalid_json"


class InvalidText(ApiError):
    """A string in the body that is not Unicode text (a lone surrogate): valid JSON, no encoding."""

    status, type = 400, "invalid_text"


class UnsupportedMediaType(ApiError):
    """A body not sent as JSON (a form, text/plain): what a web page may send cross-site."""

    status, type = 415, "unsupported_media_type"


class UnknownField(ApiError):
    """A field the demo routes do not know (a typo, most likely): named, with the nearest name."""

    status, type = 400, "unknown_field"


class InvalidRequest(ApiError):
    status, type = 422, "invalid_request"


class InvalidDeadline(ApiError):
    """A bad X-Max-Queue-Ms or `max_queue_ms`: 400 on every route, the demo routes too."""

    status, type = 400, "invalid_request"


class Unauthorized(ApiError):
    status, type = 401, "invalid_api_key"


class ModelNotFound(ApiError):
    status, type = 404, "model_not_found"


class TooManyPrompts(ApiError):
    status, type = 413, "too_many_prompts"


class DeadlineExceeded(ApiError):
    status, type = 504, "deadline_exceeded"


class StorageFull(ApiError):
    """The database of batch jobs has no room left (a full disk): nothing was written."""

    status, type = 507, "insufficient_storage"


class TooBusy(ApiError):
    """MAX_INFLIGHT_REQUESTS generate requests in flight already (service/http/inflight.py)."""

    status, type = 429, "too_busy"


# engine errors -> (status, type)
ENGINE_STATUS: dict[type, tuple[int, str]] = {
    InvalidParams: (422, "invalid_request"),
    NeverFits: (400, "request_too_large"),
    QueueFull: (429, "queue_full"),
    WaitTooLong: (429, "wait_too_long"),
    EngineDied: (503, "engine_failed"),
    NotReady: (503, "engine_unavailable"),
    ShuttingDown: (503, "shutting_down"),
    RoundFailed: (500, "generation_failed"),
    RowFailed: (500, "generation_failed"),  # the prompt's own failure; its round ran on
}

RETRY_AFTER_S = 1  # a full queue drains a round at a time; a second is the order of one round

# OpenAI's error "type" per status; our own type goes in "code"
OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


def error_body(message: str, type: str) -> dict:
    return {"error": message, "type": type}


def describe(exc: BaseException) -> tuple[int, str]:
    """(status, type) for any exception a view or an engine raises."""
    if isinstance(exc, ApiError):
        return exc.status, exc.type
    if isinstance(exc, HTTPException):  # werkzeug's own: a body too large, a wrong method, ...
        return exc.code or 500, {400: "invalid_json", 413: "body_too_large"}.get(
            exc.code, exc.name.lower().replace(" ", "_")
        )
    for cls, answer in ENGINE_STATUS.items():
        if isinstance(exc, cls):
            return answer
    if isinstance(exc, EngineError):
        return 500, "engine_error"
    return 500, "internal_error"


def message(exc: BaseException) -> str:
    if isinstance(exc, HTTPException):
        return exc.description or exc.name
    if isinstance(exc, (ApiError, EngineError)):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def openai_error(exc: BaseException) -> tuple[dict, int]:
    """OpenAI's shape, {"error": {"message", "type", "param", "code"}}, and its status: every
    invalid field is a 400 there, where the demo routes answer 422."""
    status, code = describe(exc)
    status = 400 if status == 422 else status
    body = {"message": message(exc), "type": OPENAI_TYPES.get(status, "server_error"), "param": None, "code": code}
    body["param"] = getattr(exc, "param", None)
    if isinstance(exc, WaitTooLong):
        body["predicted"] = exc.prediction.shown()
    return {"error": body}, status


def demo_error(exc: BaseException) -> tuple[dict, int]:
    """The demo routes' shape and status for `exc`."""
    status, type_ = describe(exc)
    body = error_body(message(exc), type_)
    if isinstance(exc, WaitTooLong):
        body["predicted"] = exc.prediction.shown()
    return body, status


def _respond(body: dict, status: int, exc: BaseException) -> Response:
    response = jsonify(body)
    response.status_code = status
    if status in (429, 503):  # worth retrying: a full queue drains, a draining replica has others
        # a refused wait: when the work ahead should be done, from the engine's own prediction
        retry = exc.prediction.retry_after_s if isinstance(exc, WaitTooLong) else RETRY_AFTER_S
        response.headers["Retry-After"] = str(retry)
    return response


def log_unexpected(exc: BaseException, status: int) -> None:
    """A 500 that no one raised on purpose is a bug: its traceback goes to the log."""
    if status >= 500 and not isinstance(exc, (ApiError, EngineError, HTTPException)):
        log.exception("unhandled error, request_id=%s", request_id.current(), exc_info=exc)


def register(app: Flask) -> None:
    """The demo routes' shape, for every route without a handler of its own."""

    @app.errorhandler(Exception)
    def _demo(exc: Exception):
        body, status = demo_error(exc)
        log_unexpected(exc, status)
        return _respond(body, status, exc)


def register_openai(bp: Blueprint) -> None:
    """OpenAI's shape, for the routes of `bp` (whatever name and prefix it is registered under)."""

    @bp.errorhandler(Exception)
    def _openai(exc: Exception):
        body, status = openai_error(exc)
        log_unexpected(exc, describe(exc)[0])
        return _respond(body, status, exc)
