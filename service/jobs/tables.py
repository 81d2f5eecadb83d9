"""The service's database, in SQLAlchemy Core (one code path for SQLite and PostgreSQL):
uploaded and produced files, batches, each batch's lines with their results, the workers
that run them (a heartbeat each, so that a dead worker's lines go back to the others), and the
Responses API's stored responses.
Times are seconds since the epoch in BigInteger (PostgreSQL's INTEGER is 4 bytes); what a client
names without a bound of ours (a custom_id) is Text, since PostgreSQL enforces a VARCHAR's length."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    inspect,
)
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DatabaseError, OperationalError

from service.errors import StorageFull

metadata = MetaData()

files = Table(
    "files",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("owner", String(64), nullable=False, index=True),
    Column("purpose", String(32), nullable=False),
    Column("filename", String(512), nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("created_at", BigInteger, nullable=False),
)

# a file's bytes, in pieces in order (file_bytes.py)
file_chunks = Table(
    "file_chunks",
    metadata,
    Column("file_id", String(64), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("data", LargeBinary, nullable=False),
)

batches = Table(
    "batches",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("owner", String(64), nullable=False, index=True),
    Column("engine", String(16), nullable=False),  # "vllm" (/v1) or "static" (/static/v1)
    Column("endpoint", String(64), nullable=False),
    Column("input_file_id", String(64), nullable=False),
    Column("completion_window", String(16), nullable=False),
    Column("status", String(16), nullable=False, index=True),
    Column("metadata", JSON),
    Column("errors", JSON),
    Column("output_file_id", String(64)),
    Column("error_file_id", String(64)),
    Column("created_at", BigInteger, nullable=False),
    *(
        Column(f"{event_}_at", BigInteger)
        for event_ in "in_progress expires finalizing completed failed expired cancelling cancelled".split()
    ),
)

lines = Table(
    "lines",
    metadata,
    Column("batch_id", String(64), primary_key=True),
    Column("line_no", Integer, primary_key=True),
    Column("custom_id", Text, nullable=False),
    Column("body", JSON, nullable=False),
    Column("state", String(16), nullable=False),  # pending | running | done
    Column("claim", String(64)),  # the claim that runs it now: its result counts only under it
    Column("worker", String(128)),  # who holds the claim (workers.id)
    Column("status_code", Integer),  # done: the route's answer, or null for a line that never ran
    Column("request_id", String(128)),
    Column("response", JSON),  # done: the route's body, or an error object
    Index("lines_by_state", "batch_id", "state"),
)

# the Responses API's stored responses (service/openai/responses/stored.py): each turn's own input
# items and its response object, linked to the turn before it; read until `expires_at`
responses = Table(
    "responses",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("owner", String(64), nullable=False, index=True),
    Column("previous_id", String(64)),
    Column("created_at", BigInteger, nullable=False),
    Column("expires_at", BigInteger, nullable=False, index=True),
    Column("input", JSON, nullable=False),  # this turn's input items, each with its id
    Column("response", JSON, nullable=False),  # the response object, as the client got it (or will)
    Column("bytes", Integer, nullable=False),  # of both, as JSON
    # a background one's (service/openai/responses/background.py): its run, as batch lines are
    Column("status", String(16), nullable=False, index=True),  # queued | in_progress | completed | ...
    Column("engine", String(16)),  # "vllm" (/v1) or "static" (/static/v1)
    Column("body", JSON),  # the request, run by a worker
    Column("claim", String(64)),  # the run that may write its events and its end
    Column("worker", String(128)),  # who holds the claim (workers.id)
)

# a background response's events, each as its stream sent it, in order (`sequence_number`)
response_events = Table(
    "response_events",
    metadata,
    Column("response_id", String(64), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("text", Text, nullable=False),
)

workers = Table(
    "workers",
    metadata,
    Column("id", String(128), primary_key=True),
    Column("seen_at", Float, nullable=False),  # time.time() of its last heartbeat
)


def connect(url: str) -> Engine:
    """The database at `url`, its tables made if absent. SQLite: its folder made, WAL (readers
    never wait for the one writer), and a writer waits up to 30 s for another one's lock.
    PostgreSQL: psycopg 3 for a plain postgresql:// URL, and each pooled connection tested before
    use (the server restarted, or a proxy closed it idle)."""
    if url.startswith("sqlite:///"):
        folder = os.path.dirname(url.removeprefix("sqlite:///"))
        if folder:
            os.makedirs(folder, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _wal(connection, _record) -> None:
            cursor = connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")  # WAL's own durable-enough choice
            cursor.close()
    else:
        engine = create_engine(_with_driver(url), pool_pre_ping=True)
    try:
        metadata.create_all(engine)
    except DatabaseError:  # another replica made them at the same moment: now they are there
        metadata.create_all(engine)
    _move_file_contents(engine)
    _check_columns(engine)
    return engine


def _move_file_contents(engine: Engine) -> None:
    """A files table an older version made holds each file's bytes in its own `content` column:
    they move to file_chunks (one piece each) and the column goes, in one transaction, so that
    every file stays readable. A hand-written step, not a migration tool's: it is the only one."""
    if "content" not in {c["name"] for c in inspect(engine).get_columns("files")}:
        return
    try:
        with engine.begin() as db:
            db.exec_driver_sql("INSERT INTO file_chunks (file_id, seq, data) SELECT id, 0, content FROM files")
            db.exec_driver_sql("ALTER TABLE files DROP COLUMN content")
    except DatabaseError:  # another replica moved them at the same moment
        if "content" in {c["name"] for c in inspect(engine).get_columns("files")}:
            raise


def _check_columns(engine: Engine) -> None:
    """create_all makes a missing table, never a missing column: a table an older version made
    without one of today's columns stops the start here, named, rather than failing requests."""
    found = inspect(engine)
    for table in metadata.sorted_tables:
        missing = {column.name for column in table.columns} - {c["name"] for c in found.get_columns(table.name)}
        if missing:
            raise RuntimeError(
                f"the database {engine.url.render_as_string()} has a table '{table.name}' without the column(s)"
                f" {', '.join(sorted(missing))} that this version needs: drop that table (or point"
                " DATABASE_URL or DATA_DIR at a new database)"
            )


def _with_driver(url: str):
    """postgres:// and postgresql:// (what managed databases hand out) as psycopg 3, the driver
    requirements.txt installs; SQLAlchemy's own default for them is psycopg2."""
    parsed = make_url(url.replace("postgres://", "postgresql://", 1) if url.startswith("postgres://") else url)
    return parsed.set(drivername="postgresql+psycopg") if parsed.drivername == "postgresql" else parsed


# a disk with no room: SQLite's SQLITE_FULL, PostgreSQL's disk_full (SQLSTATE 53100)
FULL = {"sqlite_errorcode": 13, "sqlstate": "53100"}


@contextlib.contextmanager
def writing(engine: Engine) -> Iterator[Connection]:
    """One transaction; a full disk ends it as StorageFull (a 507, nothing of it kept), not a 500."""
    try:
        with engine.begin() as db:
            yield db
    except OperationalError as exc:
        if any(getattr(exc.orig, name, None) == code for name, code in FULL.items()):
            raise StorageFull("the service's storage is full: nothing of this request was kept") from exc
        raise
