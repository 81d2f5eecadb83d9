"""A file's bytes in pieces (service/jobs/file_bytes.py): an upload written and a download read a
piece at a time, so a file's size never lands in a worker's memory; a batch's input file read a
line at a time, no further than its bound; an older database's files moved over, readable."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from sqlalchemy import create_engine, func, inspect, select

from service.jobs import input_file, tables
from service.jobs.file_bytes import CHUNK_BYTES
from service.jobs.store import Store
from service.jobs.tables import file_chunks

pytestmark = pytest.mark.unit

PIECES = 24  # a file of 24 MiB: far over what either side may hold
CHAT = "/v1/chat/completions"


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(f"sqlite:///{tmp_path / 'jobs.sqlite3'}")


def stream():
    """An upload's reads: each piece made as it is asked for, as werkzeug's spooled part gives them."""
    for n in range(PIECES):
        yield bytes([n]) * CHUNK_BYTES


def test_a_large_file_is_written_and_read_back_without_ever_being_held_whole(store):
    tracemalloc.start()
    try:
        made = store.add_file("", "batch", "big.jsonl", stream())
        _, written_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        read = [(len(piece), piece[0]) for piece in store.content("", made.id)]
        _, read_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert made.bytes == PIECES * CHUNK_BYTES
    assert read == [(CHUNK_BYTES, n) for n in range(PIECES)]
    assert written_peak < 4 * CHUNK_BYTES and read_peak < 4 * CHUNK_BYTES, (written_peak, read_peak)


def test_a_write_that_fails_part_way_keeps_nothing_of_the_file(store):
    def cut():
        yield b"x" * CHUNK_BYTES
        raise OSError("the client went away")

    with pytest.raises(OSError):
        store.add_file("", "batch", "cut.jsonl", cut())
    assert store.files("") == []
    with store.db.connect() as db:
        assert db.execute(select(func.count()).select_from(file_chunks)).scalar() == 0


def test_a_deleted_file_takes_its_pieces_and_another_keys_delete_takes_none(store):
    mine = store.add_file("me", "batch", "a.jsonl", b"a" * (CHUNK_BYTES + 1))
    assert not store.delete_file("them", mine.id)
    assert b"".join(store.content("me", mine.id)) == b"a" * (CHUNK_BYTES + 1)
    assert store.delete_file("me", mine.id) and store.content("me", mine.id) is None
    with store.db.connect() as db:
        assert db.execute(select(func.count()).select_from(file_chunks)).scalar() == 0


def test_an_input_file_is_read_no_further_than_its_bound_of_lines():
    line = (json.dumps({"custom_id": "x", "method": "POST", "url": CHAT, "body": {}}) + "\n").encode()

    def lines_then_a_fault():
        for n in range(4):
            yield line.replace(b'"x"', f'"{n}"'.encode())
        raise AssertionError("read past MAX_BATCH_LINES + 1 lines")

    requests, faults = input_file.read(lines_then_a_fault(), CHAT, max_lines=3)
    assert requests == [] and faults[0]["code"] == "too_many_requests" and "more than 3" in faults[0]["message"]


def test_a_line_cut_across_pieces_and_a_unicode_line_separator_in_a_string_read_as_one_line():
    text = json.dumps({"custom_id": "a\u2028b", "method": "POST", "url": CHAT, "body": {"n": 1}}, ensure_ascii=False)
    raw = (text + "\r\n\n").encode()
    requests, faults = input_file.read([raw[:5], raw[5:6], raw[6:]], CHAT, max_lines=3)
    assert faults == [] and [(r.line, r.custom_id, r.body) for r in requests] == [(1, "a\u2028b", {"n": 1})]


def test_an_older_databases_files_move_to_pieces_and_stay_readable(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.sqlite3'}"
    with create_engine(url).begin() as db:  # the files table as an older version made it
        db.exec_driver_sql(
            "CREATE TABLE files (id VARCHAR(64) PRIMARY KEY, owner VARCHAR(64) NOT NULL, purpose VARCHAR(32)"
            " NOT NULL, filename VARCHAR(512) NOT NULL, bytes BIGINT NOT NULL, created_at BIGINT NOT NULL,"
            " content BLOB NOT NULL)"
        )
        db.exec_driver_sql("INSERT INTO files VALUES ('file-1', '', 'batch', 'a.jsonl', 3, 1, x'7b7d0a')")
    store = Store(url)
    assert "content" not in {c["name"] for c in inspect(store.db).get_columns("files")}
    assert b"".join(store.content("", "file-1")) == b"{}\n"
    store.add_file("", "batch", "b.jsonl", b"new")  # the moved table takes new files
    assert [f.filename for f in store.files("")] == ["b.jsonl", "a.jsonl"]
    assert tables.connect(url)  # a second start finds nothing to move
