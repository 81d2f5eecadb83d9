"""What the Files, Batches and stored Responses APIs share: the store every view reads
(service/jobs/store.py) and the request's owner in it, OpenAI's cursor page, and the 404 of a
file, batch or response that is absent or another key's (the two look the same to the caller)."""

from __future__ import annotations

from typing import Protocol

from service.errors import ApiError
from service.http import auth, lookup
from service.jobs.store import Store, owner_of


class NotFound(ApiError):
    """No such file, batch or stored response for this key: OpenAI's 404 `not_found_error`."""

    status, type = 404, "not_found"


class Unavailable(ApiError):
    status, type = 503, "store_unavailable"


class Listed(Protocol):
    id: str

    def to_openai(self) -> dict: ...


def caller() -> tuple[Store, str]:
    """The app's store and the request's owner in it (a hash of its API key; "" while open)."""
    store = lookup.state().store
    if store is None:
        raise Unavailable("files and batches are not kept by this app (it has no store)")
    return store, owner()


def owner() -> str:
    """The request's owner in the store: a hash of its API key, "" while the service is open."""
    return owner_of(auth.request_key())


def page(records: list[Listed], limit: int) -> dict:
    """OpenAI's cursor page of the first `limit` of `records` (fetched `limit + 1`, so that one
    more says `has_more`); the SDK asks for the next page with `after=last_id`."""
    shown = records[:limit]
    return {
        "object": "list",
        "data": [record.to_openai() for record in shown],
        "first_id": shown[0].id if shown else None,
        "last_id": shown[-1].id if shown else None,
        "has_more": len(records) > limit,
    }
