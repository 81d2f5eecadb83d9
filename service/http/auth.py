"""Optional bearer-token auth for the generate routes (API_KEY); /health and /metrics stay open."""

from __future__ import annotations

import hmac

from flask import Blueprint, request

from service.errors import Unauthorized
from service.http.state import current


def require_api_key() -> None:
    keys = current().config.api_keys
    if not keys:
        return
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip().encode()
    # compare with every key, whatever matched, so the time taken says nothing about the keys
    matches = [hmac.compare_digest(token, key.encode()) for key in keys]
    if scheme.lower() != "bearer" or not any(matches):
        raise Unauthorized("missing or wrong API key: send 'Authorization: Bearer <key>'")


def request_key() -> str | None:
    """The key this request was let in with (its bearer token), None while the service is open:
    what owns the files and batches it makes (service/jobs/store.py `owner_of`)."""
    if not current().config.api_keys:
        return None
    require_api_key()
    return request.headers.get("Authorization", "").partition(" ")[2].strip()


def protect(bp: Blueprint) -> Blueprint:
    bp.before_request(require_api_key)
    return bp
