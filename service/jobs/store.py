"""The files and batches of the Files and Batches APIs, as the routes read and write them: one
`Store` over the database (tables.py), SQLite or PostgreSQL; a file's bytes are file_bytes.py's, the
lines lines.py's. Every read is by owner (`owner_of`: the API key's hash), so others' are absent."""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields

from sqlalchemy import func, insert, select, tuple_, update

from service.jobs import file_bytes, tables
from service.jobs.tables import batches, files, lines

log = logging.getLogger(__name__)

WINDOW_S = {"24h": 24 * 3600}  # completion windows OpenAI offers, and how long each is
EVENTS = "in_progress expires finalizing completed failed expired cancelling cancelled".split()


def owner_of(api_key: str | None) -> str:
    """Who owns what a request makes: "" while the service is open, else its key's hash."""
    return "" if api_key is None else hashlib.sha256(api_key.encode()).hexdigest()[:32]


def new_id(prefix: str) -> str:
    """Unique, and in the order made (the clock's nanoseconds first): listings' order holds within a second."""
    return f"{prefix}-{time.time_ns():016x}{uuid.uuid4().hex[:16]}"


@dataclass(frozen=True)
class FileRecord:
    id: str
    owner: str
    purpose: str
    filename: str
    bytes: int
    created_at: int

    def to_openai(self) -> dict:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }


@dataclass(frozen=True)
class BatchRecord:
    id: str
    owner: str
    engine: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    metadata: dict | None
    errors: list[dict] | None
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    total: int = 0  # request_counts, live from its lines
    completed: int = 0
    failed: int = 0

    def to_openai(self) -> dict:
        shown = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("owner", "engine", "total", "completed", "failed", "errors"):
            del shown[name]
        errors = {"object": "list", "data": self.errors} if self.errors else None
        counts = {"total": self.total, "completed": self.completed, "failed": self.failed}
        return {**shown, "object": "batch", "errors": errors, "request_counts": counts}


def _paged(query, table, after: str | None, order: str, limit: int):
    """`query` in (created_at, id) order, oldest first ("asc") or newest, from past the row `after`."""
    key = (table.c.created_at, table.c.id)
    if after is not None:
        mark = select(*key).where(table.c.id == after).subquery()
        at = tuple_(mark.c.created_at, mark.c.id)
        query = query.where(tuple_(*key) > at if order == "asc" else tuple_(*key) < at)
    return query.order_by(*(k.asc() if order == "asc" else k.desc() for k in key)).limit(limit)


FILE_COLUMNS = [files.c[f.name] for f in fields(FileRecord)]
BATCH_COLUMNS = [batches.c[f.name] for f in fields(BatchRecord) if f.name not in ("total", "completed", "failed")]


class Store:
    def __init__(self, url: str):
        self.db = tables.connect(url)

    # --- files ------------------------------------------------------------------------------
    def add_file(self, owner: str, purpose: str, filename: str, content: bytes | Iterable[bytes]) -> FileRecord:
        """Written whole in one transaction, from its bytes or its pieces as they come (file_bytes.write):
        a file is there with all its bytes, or not at all."""
        file_id = new_id("file")
        with tables.writing(self.db) as db:
            size = file_bytes.write(db, file_id, content)
            record = FileRecord(file_id, owner, purpose, filename, size, int(time.time()))
            db.execute(insert(files).values(**record.__dict__))
        return record

    def file(self, owner: str, file_id: str) -> FileRecord | None:
        with self.db.connect() as db:
            row = db.execute(select(*FILE_COLUMNS).where(files.c.id == file_id, files.c.owner == owner)).first()
        return None if row is None else FileRecord(*row)

    def files(
        self, owner: str, *, purpose: str | None = None, after: str | None = None, limit: int = 10000, order="desc"
    ) -> list[FileRecord]:
        """Newest first (`order="asc"`: oldest first); `after`: a file id, the ones past it in that order."""
        query = select(*FILE_COLUMNS).where(files.c.owner == owner)
        if purpose is not None:
            query = query.where(files.c.purpose == purpose)
        with self.db.connect() as db:
            return [FileRecord(*row) for row in db.execute(_paged(query, files, after, order, limit))]

    def content(self, owner: str, file_id: str) -> Iterator[bytes] | None:
        """The file's bytes, a piece at a time (file_bytes.read), or None where it is not the owner's."""
        if self.file(owner, file_id) is None:
            return None
        return file_bytes.read(self.db, file_id)

    def delete_file(self, owner: str, file_id: str) -> bool:
        with self.db.begin() as db:
            deleted = db.execute(files.delete().where(files.c.id == file_id, files.c.owner == owner)).rowcount > 0
            if deleted:
                file_bytes.delete(db, file_id)
            return deleted

    # --- batches ----------------------------------------------------------------------------
    def add_batch(
        self, owner: str, engine: str, endpoint: str, input_file_id: str, completion_window: str, metadata
    ) -> BatchRecord:
        """A new batch, `validating` until the runner has read its file."""
        now = int(time.time())
        values = {
            "id": new_id("batch"),
            "owner": owner,
            "engine": engine,
            "endpoint": endpoint,
            "input_file_id": input_file_id,
            "completion_window": completion_window,
            "status": "validating",
            "metadata": metadata,
            "created_at": now,
            "expires_at": now + WINDOW_S[completion_window],
        }
        with tables.writing(self.db) as db:
            db.execute(insert(batches).values(**values))
        log.info("batch %s: validating (%s on the %s engine)", values["id"], endpoint, engine)
        return self.batch(owner, values["id"])

    def batch(self, owner: str | None, batch_id: str) -> BatchRecord | None:
        """`owner` None: whoever owns it (the runner's view)."""
        query = select(*BATCH_COLUMNS).where(batches.c.id == batch_id)
        if owner is not None:
            query = query.where(batches.c.owner == owner)
        with self.db.connect() as db:
            row = db.execute(query).first()
            return None if row is None else self._counted(db, row)

    def batches(self, owner: str, *, after: str | None = None, limit: int = 20) -> list[BatchRecord]:
        """Newest first; `after`: a batch id, the ones made before it."""
        query = select(*BATCH_COLUMNS).where(batches.c.owner == owner)
        with self.db.connect() as db:
            return [self._counted(db, row) for row in db.execute(_paged(query, batches, after, "desc", limit)).all()]

    def batches_in(self, *statuses: str) -> list[BatchRecord]:
        """Every owner's batches in these states, oldest first (the runner's work)."""
        query = select(*BATCH_COLUMNS).where(batches.c.status.in_(statuses)).order_by(batches.c.created_at)
        with self.db.connect() as db:
            return [self._counted(db, row) for row in db.execute(query).all()]

    def census(self) -> dict[tuple[str, str], int]:
        """Every owner's batches, counted by (engine, status) in one query (/metrics)."""
        query = select(batches.c.engine, batches.c.status, func.count()).group_by(batches.c.engine, batches.c.status)
        with self.db.connect() as db:
            return {(engine, status): count for engine, status, count in db.execute(query)}

    def cancel(self, owner: str, batch_id: str) -> BatchRecord | None:
        """validating or in_progress -> cancelling (the runner ends it); any other state stays."""
        self.move(batch_id, "cancelling", only_from=("validating", "in_progress"), owner=owner)
        return self.batch(owner, batch_id)

    def move(self, batch_id: str, status: str, *, only_from=None, owner: str | None = None, **values) -> bool:
        """The batch to `status`, its timestamp set (OpenAI's `<status>_at`), if it is in one of
        `only_from` (any state: None). Returns whether it moved."""
        now = int(time.time())
        stamp = {f"{status}_at": now} if status in EVENTS else {}
        query = update(batches).where(batches.c.id == batch_id)
        if only_from is not None:
            query = query.where(batches.c.status.in_(only_from))
        if owner is not None:
            query = query.where(batches.c.owner == owner)
        with self.db.begin() as db:
            moved = db.execute(query.values(status=status, **stamp, **values)).rowcount > 0
        if moved:
            log.info("batch %s: %s", batch_id, status)
        return moved

    def finish(self, batch: BatchRecord, status: str, output: bytes, errors: bytes) -> bool:
        """A finalizing batch ends `status` with its output and error files (none where empty),
        all in one transaction: after a crash it is finalizing still, with no file, or done."""
        now = int(time.time())
        made = {  # column -> (file id, its name, its bytes)
            column: (new_id("file"), f"{batch.id}_{kind}.jsonl", content)
            for column, kind, content in (("output_file_id", "output", output), ("error_file_id", "error", errors))
            if content
        }
        ended = update(batches).where(batches.c.id == batch.id, batches.c.status == "finalizing")
        ids = {column: file_id for column, (file_id, _, _) in made.items()}
        with self.db.begin() as db:
            if db.execute(ended.values(status=status, **{f"{status}_at": now}, **ids)).rowcount == 0:
                return False  # another worker finished it
            for file_id, filename, content in made.values():
                row = {"id": file_id, "owner": batch.owner, "purpose": "batch_output", "filename": filename}
                db.execute(insert(files).values(**row, bytes=len(content), created_at=now))
                file_bytes.write(db, file_id, content)
        log.info("batch %s: %s (%d completed, %d failed)", batch.id, status, batch.completed, batch.failed)
        return True

    def _counted(self, db, row) -> BatchRecord:
        """The batch with its request_counts, from its lines as they are now."""
        counts = select(
            func.count(),
            func.count().filter((lines.c.state == "done") & (lines.c.status_code == 200)),
            func.count().filter((lines.c.state == "done") & (lines.c.status_code.is_distinct_from(200))),
        ).where(lines.c.batch_id == row.id)
        total, completed, failed = db.execute(counts).one()
        return BatchRecord(*row, total=total, completed=completed, failed=failed)
