"""The Responses API's stored responses (`store`, `previous_response_id`, `GET` and `DELETE
/responses/{id}`, `/input_items`), in the service's database (service/jobs/tables.py), so that a
response made on one replica is read and continued on another. Each row is one turn: its own
input items (each given an id, as OpenAI's input items have) and the response object the client
got, written once, whole, when the response is done: nothing half-written is ever read. Every
read is by owner (a hash of the API key), so another key's response is absent, and by
`expires_at` (RESPONSE_RETENTION_S); expired rows are deleted a few at each write."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable

from sqlalchemy import delete, insert, select
from sqlalchemy.engine import Engine

from service.errors import InvalidRequest
from service.jobs import tables
from service.jobs.tables import responses
from service.openai.storage import NotFound
from service.protocol.limits import MAX_MESSAGES

PRUNE_AT_ONCE = 100  # expired rows deleted by each write: the table never grows past retention for long
PARAM = "previous_response_id"


def with_ids(items: list[dict]) -> list[dict]:
    """Input items as OpenAI lists them: each with an `id` and a `status`, a message's content
    as parts (a string is one `input_text`, or `output_text` for the assistant's own)."""
    shown = []
    for item in items:
        kind = item.get("type") or "message"
        prefix = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}[kind]
        item = {**item, "type": kind, "id": item.get("id") or f"{prefix}_{uuid.uuid4().hex}", "status": "completed"}
        if kind == "message" and isinstance(item["content"], str):
            part = "output_text" if item["role"] == "assistant" else "input_text"
            item["content"] = [{"type": part, "text": item["content"]}]
        shown.append(item)
    return shown


class ResponseStore:
    def __init__(self, db: Engine, retention_s: int, clock: Callable[[], float] = time.time):
        self.db, self.retention_s, self.clock = db, retention_s, clock  # clock: a test's seam

    def add(self, owner: str, response: dict, items: list[dict]) -> None:
        """`response` (done) and its turn's own input `items`, in one transaction."""
        now = int(self.clock())
        size = len(json.dumps(response)) + len(json.dumps(items))
        row = {"id": response["id"], "owner": owner, "previous_id": response.get("previous_response_id")}
        row |= {"created_at": response["created_at"], "expires_at": now + self.retention_s}
        expired = select(responses.c.id).where(responses.c.expires_at <= now).limit(PRUNE_AT_ONCE)
        with tables.writing(self.db) as db:
            db.execute(delete(responses).where(responses.c.id.in_(expired.scalar_subquery())))
            db.execute(insert(responses).values(**row, input=items, response=response, bytes=size))

    def _row(self, db, owner: str, response_id: str):
        now = int(self.clock())
        query = select(responses.c.previous_id, responses.c.input, responses.c.response).where(
            responses.c.id == response_id, responses.c.owner == owner, responses.c.expires_at > now
        )
        return db.execute(query).first()

    def get(self, owner: str, response_id: str) -> dict:
        with self.db.connect() as db:
            row = self._row(db, owner, response_id)
        if row is None:
            raise NotFound(f"No response found with id '{response_id}'.")
        return row.response

    def delete(self, owner: str, response_id: str) -> None:
        with self.db.begin() as db:
            gone = db.execute(delete(responses).where(responses.c.id == response_id, responses.c.owner == owner))
        if gone.rowcount == 0:
            raise NotFound(f"No response found with id '{response_id}'.")

    def history(self, owner: str, previous_id: str | None, room: int = MAX_MESSAGES) -> list[dict]:
        """The items a turn after `previous_id` continues: every earlier turn's input items and
        output, oldest first. At most `room` items: a longer conversation is a 400."""
        turns: list[list[dict]] = []
        count, next_id = 0, previous_id
        with self.db.connect() as db:
            while next_id is not None:
                row = self._row(db, owner, next_id)
                if row is None:
                    which = "" if next_id == previous_id else f" (an earlier turn of it, '{next_id}')"
                    message = f"Previous response with id '{previous_id}' not found{which}."
                    raise NotFound(message, param=PARAM)
                turn = [*row.input, *row.response["output"]]
                count += len(turn)
                if count > room:
                    message = f"the conversation before '{previous_id}' holds over {room} items"
                    raise InvalidRequest(f"{message}: start a new one", param=PARAM)
                turns.append(turn)
                next_id = row.previous_id
        return [item for turn in reversed(turns) for item in turn]

    def input_items(self, owner: str, response_id: str) -> list[dict]:
        """The items the response read, oldest first: its conversation's and then its own."""
        with self.db.connect() as db:
            row = self._row(db, owner, response_id)
        if row is None:
            raise NotFound(f"No response found with id '{response_id}'.")
        return [*self.history(owner, row.previous_id, room=1 << 30), *row.input]
