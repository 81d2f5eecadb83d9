"""A batch's lines in the database, as the runner moves them: added once its file is read,
claimed a few at a time by a live worker, each result recorded as it completes, and written out
as the output and error files at the end.

A claim is a token: a line's result counts only under the claim that holds it, so a line handed
back (its worker died, or the route was busy) and claimed again is recorded once, whoever ran it.
A worker proves it lives by its heartbeat; a claim held by one silent past STALE_S goes back."""

from __future__ import annotations

import json
import time
import uuid

from sqlalchemy import func, insert, select, update
from sqlalchemy.engine import Engine

from service.jobs.input_file import Request
from service.jobs.tables import batches, lines, workers

STALE_S = 10.0  # a worker that beat longer ago than this is gone: its claims go back
# a worker silent this long is forgotten (its row deleted by a live one's heartbeat): a row absent
# is as dead as a stale one, so the table holds the live workers and the recently gone, no more
FORGET_S = 3600.0


class Lines:
    def __init__(self, db: Engine):
        self.db = db

    def add(self, batch_id: str, requests: list[Request]) -> None:
        """The batch's lines, pending, while it is still validating (another replica may have
        read the same file at the same time: the first write below waits for its transaction,
        and once the batch has moved on its lines are left alone)."""
        rows = [
            {"batch_id": batch_id, "line_no": r.line, "custom_id": r.custom_id, "body": r.body, "state": "pending"}
            for r in requests
        ]
        # a write first, a no-op one: it takes the batch's row lock (PostgreSQL) or the database's
        # write lock (SQLite) before its status is read, so the check and the lines are one step
        lock = update(batches).where(batches.c.id == batch_id).values(status=batches.c.status)
        with self.db.begin() as db:
            db.execute(lock)
            status = db.execute(select(batches.c.status).where(batches.c.id == batch_id)).scalar()
            if status not in (None, "validating"):  # None: lines without a batch row (the unit tests')
                return
            db.execute(lines.delete().where(lines.c.batch_id == batch_id))  # a validation cut short, redone
            db.execute(insert(lines), rows)

    def heartbeat(self, worker: str) -> None:
        now = time.time()
        with self.db.begin() as db:
            if db.execute(update(workers).where(workers.c.id == worker).values(seen_at=now)).rowcount == 0:
                db.execute(insert(workers).values(id=worker, seen_at=now))
                db.execute(workers.delete().where(workers.c.seen_at < now - FORGET_S))  # at a new worker's first beat

    def claim(self, batch_id: str, worker: str, count: int) -> tuple[str, list[tuple[int, str, dict]]]:
        """Up to `count` of the batch's lines for `worker`: pending ones, or ones whose worker has
        gone silent. Returns (the claim, [(line_no, custom_id, body)]).

        The lines are picked FOR UPDATE SKIP LOCKED (PostgreSQL; SQLite has one writer at a time
        and SQLAlchemy renders nothing there): replicas claiming at once take different lines,
        none waiting for another's transaction."""
        token = uuid.uuid4().hex
        alive = select(workers.c.id).where(workers.c.seen_at >= time.time() - STALE_S)
        free = (lines.c.state == "pending") | ((lines.c.state == "running") & lines.c.worker.not_in(alive))
        picked = select(lines.c.line_no).where(lines.c.batch_id == batch_id, free).order_by(lines.c.line_no)
        # a CTE, run once: as an IN (subquery), PostgreSQL may run the pick again for each row it
        # updates, and each run skips the rows this very statement has just taken
        picked = picked.limit(count).with_for_update(skip_locked=True, of=lines).cte("picked")
        taking = update(lines).where(lines.c.batch_id == batch_id, lines.c.line_no.in_(select(picked.c.line_no)), free)
        with self.db.begin() as db:
            db.execute(taking.values(state="running", claim=token, worker=worker))
            mine = select(lines.c.line_no, lines.c.custom_id, lines.c.body).where(
                lines.c.batch_id == batch_id, lines.c.claim == token
            )
            return token, [tuple(row) for row in db.execute(mine.order_by(lines.c.line_no))]

    def record(self, batch_id: str, line_no: int, claim: str, status_code: int | None, request_id, response) -> bool:
        """The line's result, if `claim` still holds it; whether it was recorded."""
        with self.db.begin() as db:
            done = update(lines).where(lines.c.batch_id == batch_id, lines.c.line_no == line_no, lines.c.claim == claim)
            values = {"state": "done", "status_code": status_code, "request_id": request_id, "response": response}
            return db.execute(done.values(**values)).rowcount > 0

    def release(self, batch_id: str, line_no: int, claim: str) -> None:
        """Back to pending (the route was busy: another try later)."""
        with self.db.begin() as db:
            back = update(lines).where(lines.c.batch_id == batch_id, lines.c.line_no == line_no, lines.c.claim == claim)
            db.execute(back.values(state="pending", claim=None, worker=None))

    def open_count(self, batch_id: str) -> int:
        """Lines not done yet."""
        query = select(func.count()).where(lines.c.batch_id == batch_id, lines.c.state != "done")
        with self.db.connect() as db:
            return db.execute(query).scalar()

    def running_elsewhere(self, batch_id: str) -> bool:
        """Whether a live worker still runs one of the batch's lines."""
        alive = select(workers.c.id).where(workers.c.seen_at >= time.time() - STALE_S)
        query = select(lines.c.line_no).where(
            lines.c.batch_id == batch_id, lines.c.state == "running", lines.c.worker.in_(alive)
        )
        with self.db.connect() as db:
            return db.execute(query.limit(1)).first() is not None

    def census(self, statuses: tuple[str, ...]) -> dict[tuple[str, str], int]:
        """The lines of every batch in `statuses`, counted by (engine, state) in one query, a done
        line as done_ok (answered 200) or done_error (/metrics)."""
        key = (batches.c.engine, lines.c.state, lines.c.status_code)
        query = select(*key, func.count()).select_from(lines.join(batches, lines.c.batch_id == batches.c.id))
        query = query.where(batches.c.status.in_(statuses)).group_by(*key)
        counts: dict[tuple[str, str], int] = {}
        with self.db.connect() as db:
            for engine, state, status_code, count in db.execute(query):
                if state == "done":
                    state = "done_ok" if status_code == 200 else "done_error"
                counts[engine, state] = counts.get((engine, state), 0) + count
        return counts

    def results(self, batch_id: str, unfinished: str | None) -> tuple[bytes, bytes]:
        """(output file, error file) as JSONL, in the input's order: a line answered 200 in the
        output, any other answer in the errors; `unfinished`: the error code of lines that never
        ran (batch_expired, batch_cancelled)."""
        query = select(lines).where(lines.c.batch_id == batch_id).order_by(lines.c.line_no)
        output, errors = [], []
        with self.db.connect() as db:
            for row in db.execute(query):
                item = {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": row.custom_id}
                if row.state == "done" and row.status_code is not None:
                    response = {"status_code": row.status_code, "request_id": row.request_id, "body": row.response}
                    (output if row.status_code == 200 else errors).append({**item, "response": response, "error": None})
                elif row.state == "done":  # refused before it reached a route (runner.py)
                    errors.append({**item, "response": None, "error": row.response})
                elif unfinished is not None:
                    message = f"the batch ended ({unfinished}) before this request ran"
                    errors.append({**item, "response": None, "error": {"code": unfinished, "message": message}})
        return _jsonl(output), _jsonl(errors)


def _jsonl(items: list[dict]) -> bytes:
    return "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items).encode()
