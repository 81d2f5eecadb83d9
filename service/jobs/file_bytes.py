"""A file's bytes in the database, in pieces of at most CHUNK_BYTES (tables.file_chunks): an
upload is written and a download read one piece at a time, so a worker never holds a whole file
(up to MAX_FILE_BYTES) in its memory."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

from sqlalchemy import insert, select
from sqlalchemy.engine import Connection, Engine

from service.jobs.tables import file_chunks

CHUNK_BYTES = 1 << 20


def write(db: Connection, file_id: str, content: bytes | Iterable[bytes]) -> int:
    """The file's pieces, in the caller's transaction: its bytes cut at CHUNK_BYTES, or the
    pieces an iterable yields as they come (whatever it raises ends the transaction). Returns
    the file's size."""
    if isinstance(content, bytes):
        whole = content
        content = (whole[at : at + CHUNK_BYTES] for at in range(0, len(whole), CHUNK_BYTES))
    size, seq = 0, 0
    for piece in content:
        if piece:
            db.execute(insert(file_chunks).values(file_id=file_id, seq=seq, data=piece))
            size, seq = size + len(piece), seq + 1
    return size


def read(engine: Engine, file_id: str) -> Iterator[bytes]:
    """The file's pieces in order, each read alone (nothing held open between them, so a slow
    client holds no connection): a file deleted while it is read ends short."""
    for seq in itertools.count():
        with engine.connect() as db:
            query = select(file_chunks.c.data).where(file_chunks.c.file_id == file_id, file_chunks.c.seq == seq)
            piece = db.execute(query).scalar()
        if piece is None:
            return
        yield piece


def delete(db: Connection, file_id: str) -> None:
    db.execute(file_chunks.delete().where(file_chunks.c.file_id == file_id))
