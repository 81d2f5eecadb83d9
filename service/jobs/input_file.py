"""A batch's input file read as OpenAI reads it: JSONL, one request a line, `{"custom_id",
"method": "POST", "url", "body"}`, every url the batch's endpoint, every custom_id its own.
A file that breaks a rule fails the whole batch, each fault an entry of its `errors` (OpenAI's
{code, message, param, line}); a line whose body the route refuses is not a fault of the file:
it runs, and its answer is the route's error (runner.py)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

MAX_ERRORS = 20  # what a failed batch lists of its file's faults; the count says the rest


@dataclass(frozen=True)
class Request:
    line: int  # 1-based, as an editor counts
    custom_id: str
    body: dict


def read(content: Iterable[bytes], endpoint: str, max_lines: int) -> tuple[list[Request], list[dict]]:
    """(the requests, []) or ([], the faults that fail the batch), from the file's pieces as the
    store reads them, a line at a time: no more of it is read than MAX_BATCH_LINES requests."""
    requests, faults, seen = [], [], set()
    for n, raw in enumerate(_lines(content), 1):
        if not raw.strip():
            continue
        if len(requests) + len(faults) == max_lines:
            message = f"more than {max_lines} requests; a batch holds at most {max_lines} (MAX_BATCH_LINES)"
            return [], [_fault("too_many_requests", message, None)]
        request, fault = _line(n, raw, endpoint)
        if fault is None and request.custom_id in seen:
            fault = _fault("duplicate_custom_id", f"custom_id '{request.custom_id}' is used twice", "custom_id", n)
        if fault is not None:
            faults.append(fault)
            continue
        seen.add(request.custom_id)
        requests.append(request)
    if not requests and not faults:
        return [], [_fault("empty_file", "the input file holds no requests", None)]
    if faults:
        more = len(faults) - MAX_ERRORS
        shown = faults[:MAX_ERRORS]
        if more > 0:
            shown.append(_fault("more_errors", f"and {more} more lines like these", None))
        return [], shown
    return requests, []


def _lines(pieces: Iterable[bytes]) -> Iterator[bytes]:
    """The file's lines (JSONL's: split at "\n" only), joined across the pieces they span."""
    start = bytearray()
    for piece in pieces:
        *ends, rest = piece.split(b"\n")
        for end in ends:
            yield bytes(start + end)
            start.clear()
        start += rest
    if start:
        yield bytes(start)


def _line(n: int, raw: bytes, endpoint: str) -> tuple[Request | None, dict | None]:
    try:
        item = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return None, _fault("invalid_json_line", f"not UTF-8 text: {exc.reason}", None, n)
    except json.JSONDecodeError as exc:
        return None, _fault("invalid_json_line", f"not a JSON object: {exc.msg}", None, n)
    if not isinstance(item, dict):
        return None, _fault("invalid_json_line", "not a JSON object", None, n)
    custom_id, method, url, body = (item.get(k) for k in ("custom_id", "method", "url", "body"))
    if not isinstance(custom_id, str) or not custom_id:
        return None, _fault("missing_required_parameter", "'custom_id' must be a non-empty string", "custom_id", n)
    if "\x00" in custom_id:  # no text column holds it (PostgreSQL refuses it)
        return None, _fault("invalid_custom_id", "'custom_id' must not hold a NUL character", "custom_id", n)
    if method != "POST":
        return None, _fault("invalid_method", "'method' must be POST", "method", n)
    if url != endpoint:
        message = f"'url' is {url!r}; every request of this batch goes to its endpoint, {endpoint}"
        return None, _fault("mismatched_endpoint", message, "url", n)
    if not isinstance(body, dict):
        return None, _fault("invalid_request", "'body' must be a JSON object", "body", n)
    return Request(n, custom_id, body), None


def _fault(code: str, message: str, param: str | None, line: int | None = None) -> dict:
    return {"code": code, "message": message, "param": param, "line": line}
