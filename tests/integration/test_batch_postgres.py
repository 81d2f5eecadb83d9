"""The batch store on a real PostgreSQL (tests/helpers/postgres.py starts one; skipped, saying why,
where it cannot): every store test of tests/unit/test_batch_store.py again, each on a database of
its own, and what only a shared server shows: claims made at once take different lines and none
waits for another's, replicas making the tables at once all start, values SQLite never bounds
come back whole."""

from __future__ import annotations

import inspect
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import create_engine, select

from service.jobs import input_file, tables
from service.jobs.lines import Lines
from service.jobs.store import Store
from tests.helpers.postgres import database, postgres_server
from tests.unit import test_batch_store as on_sqlite
from tests.unit import test_file_bytes as pieces_on_sqlite

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server():
    with postgres_server() as address:
        yield address


@pytest.fixture
def url(server):
    with database(server) as address:
        yield address


@pytest.fixture
def store(url):
    made = Store(url)
    yield made
    made.db.dispose()


# every test of the SQLite module that takes a `store`, run here on this module's
globals().update(
    {
        name: test
        for module in (on_sqlite, pieces_on_sqlite)
        for name, test in vars(module).items()
        if name.startswith("test_") and "store" in inspect.signature(test).parameters
    }
)


def test_an_older_databases_files_move_to_pieces_and_stay_readable(url):
    with create_engine(url).begin() as db:  # the files table as an older version made it
        db.exec_driver_sql(
            "CREATE TABLE files (id VARCHAR(64) PRIMARY KEY, owner VARCHAR(64) NOT NULL, purpose VARCHAR(32)"
            " NOT NULL, filename VARCHAR(512) NOT NULL, bytes BIGINT NOT NULL, created_at BIGINT NOT NULL,"
            " content BYTEA NOT NULL)"
        )
        db.exec_driver_sql("INSERT INTO files VALUES ('file-1', '', 'batch', 'a.jsonl', 3, 1, '\\x7b7d0a')")
    store = Store(url)
    assert b"".join(store.content("", "file-1")) == b"{}\n"
    assert [f.id for f in store.files("")] == ["file-1"]
    store.db.dispose()


def lines_of(store: Store, batch_id: str, count: int) -> Lines:
    lines = Lines(store.db)
    items = [on_sqlite.request(str(i)) for i in range(count)]
    lines.add(batch_id, input_file.read([on_sqlite.jsonl(*items)], CHAT, count)[0])
    return lines


def test_a_claim_skips_the_lines_another_transaction_holds(store):
    """A replica mid-claim holds its lines' row locks: another's claim takes the next lines at
    once instead of waiting for that transaction (FOR UPDATE SKIP LOCKED)."""
    lines = lines_of(store, "b", 4)
    lines.heartbeat("w")
    held = select(tables.lines.c.line_no).where(tables.lines.c.line_no <= 2).with_for_update()
    with store.db.connect() as other:
        with other.begin():
            assert other.execute(held).scalars().all() == [1, 2]
            taken = []
            claimer = threading.Thread(target=lambda: taken.append(lines.claim("b", "w", 4)))
            claimer.start()
            claimer.join(10)
            assert not claimer.is_alive(), "the claim waited for the other transaction's lines"
    assert [line_no for line_no, _, _ in taken[0][1]] == [3, 4]


def test_claims_made_at_once_take_every_line_once(store):
    lines = lines_of(store, "b", 60)
    workers = [f"w{i}" for i in range(6)]
    for worker in workers:
        lines.heartbeat(worker)

    def claim_all(worker: str) -> list[int]:
        mine = []
        while taken := lines.claim("b", worker, 3)[1]:
            mine += [line_no for line_no, _, _ in taken]
        return mine

    with ThreadPoolExecutor(len(workers)) as pool:
        claimed = [line_no for mine in pool.map(claim_all, workers) for line_no in mine]
    assert sorted(claimed) == list(range(1, 61))


def test_replicas_making_the_tables_at_once_all_start(url):
    with ThreadPoolExecutor(4) as pool:
        engines = list(pool.map(tables.connect, [url] * 4))
    for engine in engines:
        engine.dispose()


def test_a_plain_postgresql_url_takes_psycopg(url):
    engine = tables.connect(url.replace("postgresql+psycopg://", "postgresql://"))
    assert engine.dialect.driver == "psycopg"
    engine.dispose()


def test_what_sqlite_never_bounds_comes_back_whole(store):
    content = bytes(range(256)) * 4096  # every byte value, a megabyte
    made = store.add_file("", "batch", "x" * 255, content)
    assert b"".join(store.content("", made.id)) == content and store.file("", made.id).filename == "x" * 255
    long_id = "c" * 5000
    lines = Lines(store.db)
    body = {"messages": [{"role": "user", "content": "é\u0000☃"}], "metadata": {"k": [1, None]}}
    item = {"custom_id": long_id, "method": "POST", "url": CHAT, "body": body}
    lines.add("b", input_file.read([json.dumps(item).encode()], CHAT, 1)[0])
    lines.heartbeat("w")
    claim, [(line_no, custom_id, got)] = lines.claim("b", "w", 1)
    assert custom_id == long_id and got == body
    assert lines.record("b", line_no, claim, 200, "r", {"text": "\u0000"})
    [out] = lines.results("b", None)[0].decode().splitlines()
    assert json.loads(out)["response"]["body"] == {"text": "\u0000"}
