"""`/responses` under each base URL (service/openai/router.py adds them): `POST` makes one; the
stored ones (stored.py) are read, listed and deleted by the other routes, which are storage (they
answer whatever the engine's state, outside the in-flight cap on generate requests)."""

from __future__ import annotations

import functools

from flask import jsonify, request

from service.errors import InvalidRequest
from service.http import lookup, sse
from service.http.body import json_body
from service.openai import fields, storage
from service.openai.responses import serving
from service.openai.responses.follow import follow
from service.openai.responses.protocol import ItemList, Responses, Retrieve
from service.openai.responses.stored import PARAM, ResponseStore, with_ids
from service.protocol import validate


def _stored() -> tuple[ResponseStore, str]:
    """The app's stored responses and the request's owner in them."""
    responses = lookup.state().responses
    if responses is None:
        raise storage.Unavailable("responses are not kept by this app (it has no store)")
    return responses, storage.owner()


def create_response(engine: str):
    body = json_body(request)
    req = fields.parse(body, Responses, "responses", lookup.config())
    served = lookup.served()
    served.check_model(req.model)
    history, keep = [], None
    if lookup.batch_line():  # run under the service's own key: it neither reads nor keeps one of a caller's
        if req.previous_response_id is not None or req.background:
            field = PARAM if req.previous_response_id is not None else "background"
            raise InvalidRequest("a batch line neither continues nor keeps a stored response", param=field)
    elif req.store is not False or req.previous_response_id is not None:
        responses, owner = _stored()
        history = responses.history(owner, req.previous_response_id) if req.previous_response_id else []
        items = with_ids(req.own_items())
        if req.background:  # checked here (its 400s now), run by a worker (background.py)
            response = serving.queue(req, served, history)
            responses.add(owner, response, items, engine=engine, body=body)
            lookup.state().background.kick()
            if req.stream:
                return sse.response(follow(responses, owner, response["id"], -1))
            return jsonify(response)
        if req.store is not False:
            keep = functools.partial(_keep, responses, owner, items)
    return serving.create_response(req, served, functools.partial(lookup.run, engine), history, keep)


def _keep(responses: ResponseStore, owner: str, items: list[dict], response: dict) -> None:
    responses.add(owner, response, items)


def retrieve_response(engine: str, response_id: str):
    query = validate(Retrieve, request.args.to_dict(), lookup.config())
    responses, owner = _stored()
    found = responses.get(owner, response_id)
    if not query.stream:
        return jsonify(found)
    if not found.get("background"):
        raise InvalidRequest("only a background response's events are kept to stream again", param="stream")
    after = -1 if query.starting_after is None else query.starting_after
    return sse.response(follow(responses, owner, response_id, after))


def delete_response(engine: str, response_id: str):
    responses, owner = _stored()
    responses.delete(owner, response_id)
    return jsonify({"id": response_id, "object": "response", "deleted": True})


def list_input_items(engine: str, response_id: str):
    query = validate(ItemList, request.args.to_dict(), lookup.config())
    responses, owner = _stored()
    items = responses.input_items(owner, response_id)
    if query.order == "desc":
        items.reverse()
    if query.after is not None:
        ids = [item["id"] for item in items]
        items = items[ids.index(query.after) + 1 :] if query.after in ids else []
    shown = items[: query.limit]
    first, last = (shown[0]["id"], shown[-1]["id"]) if shown else (None, None)
    page = {"object": "list", "data": shown, "first_id": first, "last_id": last}
    return jsonify({**page, "has_more": len(items) > query.limit})


def cancel_response(engine: str, response_id: str):
    responses, owner = _stored()
    return jsonify(responses.cancel(owner, response_id))


# storage: no prompt runs behind these
STORED_ROUTES = [
    ("GET", "/responses/<response_id>", retrieve_response),
    ("DELETE", "/responses/<response_id>", delete_response),
    ("GET", "/responses/<response_id>/input_items", list_input_items),
    ("POST", "/responses/<response_id>/cancel", cancel_response),
]
ROUTES = [("POST", "/responses", create_response), *STORED_ROUTES]
