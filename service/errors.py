"""One place that turns exceptions into JSON errors: {"error": "...", "type": "..."}."""

from __future__ import annotations

import logging

from flask import Flask, jsonify
from werkzeug.exceptions import HTTPException

from batcher.errors import EngineError, InvalidParams, NotReady, QueueFull, RoundFailed, ShuttingDown

log = logging.getLogger(__name__)


class ApiError(Exception):
    status = 400
    type = "bad_request"

    def __init__(self, message: str, *, status: int | None = None, type: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status = status or self.status
        self.type = type or self.type
        self.param = param  # the request field at fault, where there is one


class InvalidJson(ApiError):
    status, type = 400, "invalid_json"


class InvalidRequest(ApiError):
    status, type = 422, "invalid_request"


class TooManyPrompts(ApiError):
    status, type = 413, "too_many_prompts"


class DeadlineExceeded(ApiError):
    status, type = 504, "deadline_exceeded"


# engine errors -> (status, type)
ENGINE_STATUS: dict[type, tuple[int, str]] = {
    InvalidParams: (422, "invalid_request"),
    QueueFull: (429, "queue_full"),
    NotReady: (503, "engine_unavailable"),
    ShuttingDown: (503, "shutting_down"),
    RoundFailed: (500, "generation_failed"),
}

RETRY_AFTER_S = 1  # a full queue drains a round at a time; a second is the order of one round


def error_body(message: str, type: str) -> dict:
    return {"error": message, "type": type}


def describe(exc: BaseException) -> tuple[int, str]:
    """(status, type) for any exception a view or an engine raises."""
    if isinstance(exc, ApiError):
        return exc.status, exc.type
    for cls, answer in ENGINE_STATUS.items():
        if isinstance(exc, cls):
            return answer
    if isinstance(exc, EngineError):
        return 500, "engine_error"
    return 500, "internal_error"


def register(app: Flask) -> None:
    @app.errorhandler(ApiError)
    @app.errorhandler(EngineError)
    def _known(exc: Exception):
        status, type_ = describe(exc)
        response = jsonify(error_body(str(exc), type_))
        response.status_code = status
        if status == 429:
            response.headers["Retry-After"] = str(RETRY_AFTER_S)
        return response

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException):
        type_ = {400: "invalid_json", 413: "body_too_large"}.get(exc.code, exc.name.lower().replace(" ", "_"))
        response = jsonify(error_body(exc.description or exc.name, type_))
        response.status_code = exc.code or 500
        return response

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        log.exception("unhandled error")
        return jsonify(error_body(f"{type(exc).__name__}: {exc}", "internal_error")), 500
