"""How long a request is willing to wait for its first token: the `X-Max-Queue-Ms` header on
every generate route, or `max_queue_ms` in the body of the demo and OpenAI routes (both given:
the stricter). The engine refuses it at once (429 `wait_too_long`, Retry-After) when its
predicted time to first token is longer (batcher/engine.py `submit`), and, with or without
one, when its predicted completion is longer than REQUEST_TIMEOUT_S."""

from __future__ import annotations

import math

from batcher.predict import Prediction
from service.errors import InvalidDeadline

HEADER = "X-Max-Queue-Ms"


def _header_milliseconds(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise InvalidDeadline(f"'{HEADER}' must be a number of milliseconds, got {text!r}", param=HEADER) from None
    if not math.isfinite(value) or value < 0:
        raise InvalidDeadline(f"'{HEADER}' must be a finite number >= 0, got {value!r}", param=HEADER)
    return value


def max_ttft_s(headers, body_ms: float | None) -> float | None:
    """The request's deadline for its first token in seconds, None without one: the lower of the
    X-Max-Queue-Ms header and the body's `max_queue_ms` (its model checked it)."""
    limits = [] if body_ms is None else [body_ms]
    if HEADER in headers:
        limits.append(_header_milliseconds(headers[HEADER]))
    return min(limits) / 1000 if limits else None


def headers(prediction: Prediction) -> dict[str, str]:
    """What the engine predicted at admission, in seconds: `x-predicted-wait` until the request's
    first prompt starts (what `x-queue-time` measures), `x-predicted-ttft` until its first token;
    "unknown" before the engine has measured anything."""

    def seconds(value: float | None) -> str:
        return "unknown" if value is None else f"{value:.4f}"

    return {"x-predicted-wait": seconds(prediction.queue_s), "x-predicted-ttft": seconds(prediction.ttft_s)}
