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
from dataclasses import dataclass

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Engine

from service.errors import InvalidRequest
from service.jobs import tables
from service.jobs.lines import STALE_S
from service.jobs.tables import response_events, responses, workers
from service.openai.storage import NotFound
from service.protocol.limits import MAX_MESSAGES

PRUNE_AT_ONCE = 100  # expired rows deleted by each write: the table never grows past retention for long
PARAM = "previous_response_id"
RUNNING = ("queued", "in_progress")  # a background response's states before its end


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

    def add(self, owner: str, response: dict, items: list[dict], engine: str | None = None, body=None) -> None:
        """`response` and its turn's own input `items`, in one transaction: done, or (a background
        one, with its `engine` and request `body`) queued for a worker (background.py)."""
        now = int(self.clock())
        size = len(json.dumps(response)) + len(json.dumps(items))
        row = {"id": response["id"], "owner": owner, "previous_id": response.get("previous_response_id")}
        row |= {"created_at": response["created_at"], "expires_at": now + self.retention_s}
        row |= {"status": response["status"], "engine": engine, "body": body}
        expired = select(responses.c.id).where(responses.c.expires_at <= now).limit(PRUNE_AT_ONCE).scalar_subquery()
        with tables.writing(self.db) as db:
            db.execute(delete(response_events).where(response_events.c.response_id.in_(expired)))
            db.execute(delete(responses).where(responses.c.id.in_(expired)))
            db.execute(insert(responses).values(**row, input=items, response=response, bytes=size))

    def _row(self, db, owner: str, response_id: str):
        now = int(self.clock())
        columns = (responses.c.previous_id, responses.c.input, responses.c.response, responses.c.status)
        query = select(*columns, responses.c.claim).where(
            responses.c.id == response_id, responses.c.owner == owner, responses.c.expires_at > now
        )
        return db.execute(query).first()

    def get(self, owner: str, response_id: str) -> dict:
        """The response as it is now (a background one's status as its run left it)."""
        with self.db.connect() as db:
            row = self._row(db, owner, response_id)
        if row is None:
            raise NotFound(f"No response found with id '{response_id}'.")
        return {**row.response, "status": row.status}

    def delete(self, owner: str, response_id: str) -> None:
        """Gone, its events too (a run still at work stops at its next event: its claim is gone)."""
        with self.db.begin() as db:
            gone = db.execute(delete(responses).where(responses.c.id == response_id, responses.c.owner == owner))
            if gone.rowcount:
                db.execute(delete(response_events).where(response_events.c.response_id == response_id))
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
                if row.status in RUNNING:
                    message = f"Previous response '{next_id}' is still {row.status}: wait until it is done"
                    raise InvalidRequest(message, param=PARAM)
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

    # --- background runs (background.py): claimed as batch lines are, by a live worker ----------
    def claim(self, worker: str, engines: list[str]) -> Job | None:
        """The oldest queued background response on one of `engines` for `worker`, or one whose
        worker went silent (STALE_S): its events so far are dropped, it runs again from the start."""
        token, now = uuid.uuid4().hex, int(self.clock())
        alive = select(workers.c.id).where(workers.c.seen_at >= time.time() - STALE_S)
        free = (responses.c.status == "queued") | (
            (responses.c.status == "in_progress") & responses.c.worker.not_in(alive)
        )
        picked = select(responses.c.id).where(free, responses.c.engine.in_(engines), responses.c.expires_at > now)
        picked = picked.order_by(responses.c.created_at).limit(1).with_for_update(skip_locked=True, of=responses)
        picked = picked.cte("picked")  # run once (lines.py `claim` says why)
        taking = update(responses).where(responses.c.id.in_(select(picked.c.id)), free)
        with tables.writing(self.db) as db:
            # not its rowcount: sqlite3 gives -1 for a statement that starts WITH
            db.execute(taking.values(status="in_progress", claim=token, worker=worker))
            columns = (responses.c.id, responses.c.owner, responses.c.engine, responses.c.body, responses.c.response)
            row = db.execute(select(*columns).where(responses.c.claim == token)).first()
            if row is None:
                return None
            db.execute(delete(response_events).where(response_events.c.response_id == row.id))
        return Job(row.id, token, row.owner, row.engine, row.body, row.response)

    def _held(self, db, job: Job):
        """A write that takes the row's lock, where `job`'s claim still holds it running."""
        held = update(responses).where(
            responses.c.id == job.id, responses.c.claim == job.claim, responses.c.status == "in_progress"
        )
        return db.execute(held.values(claim=job.claim)).rowcount > 0

    def record(self, job: Job, seq: int, text: str, end: dict | None = None) -> bool:
        """The run's event `seq` (and with `end`, the response it ends with, in the same
        transaction); False once its claim is gone (cancelled, deleted, taken over): it stops."""
        with tables.writing(self.db) as db:
            if not self._held(db, job):
                return False
            db.execute(insert(response_events).values(response_id=job.id, seq=seq, text=text))
            if end is not None:
                done = update(responses).where(responses.c.id == job.id)
                db.execute(done.values(status=end["status"], response=end, worker=None))
        return True

    def release(self, job: Job) -> None:
        """Back to queued (its engine could not take it now): another turn, or worker, tries again."""
        with tables.writing(self.db) as db:
            if self._held(db, job):
                db.execute(delete(response_events).where(response_events.c.response_id == job.id))
                back = update(responses).where(responses.c.id == job.id)
                db.execute(back.values(status="queued", claim=None, worker=None))

    def cancel(self, owner: str, response_id: str) -> dict:
        """A background response queued or running: cancelled (its run stops at its next event);
        one already done stays as it is. Another one: a 400."""
        if not self.get(owner, response_id).get("background"):
            raise InvalidRequest("Only responses created with background=true can be cancelled.", param="response_id")
        stop = update(responses).where(responses.c.id == response_id, responses.c.status.in_(RUNNING))
        with tables.writing(self.db) as db:
            db.execute(stop.values(status="cancelled", worker=None))
        return self.get(owner, response_id)

    def events(self, owner: str, response_id: str, after: int) -> tuple[list[tuple[int, str]], str, str | None]:
        """A background response's events past `after`, then its status and claim."""
        query = select(response_events.c.seq, response_events.c.text).where(
            response_events.c.response_id == response_id, response_events.c.seq > after
        )
        with self.db.connect() as db:
            row = self._row(db, owner, response_id)
            if row is None:
                raise NotFound(f"No response found with id '{response_id}'.")
            found = [tuple(r) for r in db.execute(query.order_by(response_events.c.seq))]
        return found, row.status, row.claim


@dataclass(frozen=True)
class Job:
    """A background response claimed by a worker's run."""

    id: str
    claim: str
    owner: str
    engine: str
    body: dict
    response: dict
