"""The database of batch jobs, in SQLAlchemy Core (one code path for SQLite and PostgreSQL):
uploaded and produced files, batches, each batch's lines with their results, and the workers
that run them (a heartbeat each, so that a dead worker's lines go back to the others)."""

from __future__ import annotations

import os

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
    create_engine,
    event,
)
from sqlalchemy.engine import Engine

metadata = MetaData()

files = Table(
    "files",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("owner", String(64), nullable=False, index=True),
    Column("purpose", String(32), nullable=False),
    Column("filename", String(512), nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("created_at", Integer, nullable=False),
    Column("content", LargeBinary, nullable=False),  # read only by `content`: listings leave it
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
    Column("created_at", Integer, nullable=False),
    *(
        Column(f"{event_}_at", Integer)
        for event_ in "in_progress expires finalizing completed failed expired cancelling cancelled".split()
    ),
)

lines = Table(
    "lines",
    metadata,
    Column("batch_id", String(64), primary_key=True),
    Column("line_no", Integer, primary_key=True),
    Column("custom_id", String(512), nullable=False),
    Column("body", JSON, nullable=False),
    Column("state", String(16), nullable=False),  # pending | running | done
    Column("claim", String(64)),  # the claim that runs it now: its result counts only under it
    Column("worker", String(128)),  # who holds the claim (workers.id)
    Column("status_code", Integer),  # done: the route's answer, or null for a line that never ran
    Column("request_id", String(128)),
    Column("response", JSON),  # done: the route's body, or an error object
    Index("lines_by_state", "batch_id", "state"),
)

workers = Table(
    "workers",
    metadata,
    Column("id", String(128), primary_key=True),
    Column("seen_at", Float, nullable=False),  # time.time() of its last heartbeat
)


def connect(url: str) -> Engine:
    """The database at `url`, its tables made if absent. SQLite: its folder made, WAL (readers
    never wait for the one writer), and a writer waits up to 30 s for another one's lock."""
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
        engine = create_engine(url, pool_pre_ping=True)
    metadata.create_all(engine)
    return engine
