"""The batch jobs' store without a model or a server: files by owner, a batch's states, an input
file's faults, and the lines' claims (a dead worker's lines go back; a result counts once)."""

from __future__ import annotations

import json
import time

import pytest
from sqlalchemy import event, select

from service.errors import StorageFull
from service.jobs import input_file, tables
from service.jobs.lines import FORGET_S, Lines
from service.jobs.store import Store, owner_of

pytestmark = pytest.mark.unit

CHAT = "/v1/chat/completions"


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(f"sqlite:///{tmp_path / 'jobs.sqlite3'}")


def pieces(content: bytes, size: int = 7) -> list[bytes]:
    """A file as the store hands it over, cut small here so that lines span pieces."""
    return [content[at : at + size] for at in range(0, len(content), size)]


def jsonl(*items) -> bytes:
    return "".join(json.dumps(item) + "\n" for item in items).encode()


def request(custom_id: str, url: str = CHAT, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": {"messages": [], **body}}


def test_a_file_belongs_to_the_key_that_made_it(store):
    mine, theirs = owner_of("key-1"), owner_of("key-2")
    assert mine != theirs and "key-1" not in mine and owner_of(None) == ""
    made = store.add_file(mine, "batch", "lines.jsonl", b"{}\n")
    assert store.file(mine, made.id) == made and b"".join(store.content(mine, made.id)) == b"{}\n"
    assert store.file(theirs, made.id) is None and store.content(theirs, made.id) is None
    assert store.delete_file(theirs, made.id) is False and store.delete_file(mine, made.id) is True
    assert store.file(mine, made.id) is None


def test_files_list_newest_first_and_pages_after_an_id(store):
    made = [store.add_file("", "batch", f"{i}.jsonl", b"x") for i in range(5)]
    listed = [f.id for f in store.files("")]
    assert sorted(listed) == sorted(f.id for f in made) and len(listed) == 5
    assert [f.id for f in store.files("", after=listed[1], limit=2)] == listed[2:4]
    assert [f.id for f in store.files("", order="asc")] == listed[::-1]


def test_a_batch_moves_only_from_the_states_named(store):
    source = store.add_file("", "batch", "in.jsonl", jsonl(request("a")))
    batch = store.add_batch("", "vllm", CHAT, source.id, "24h", {"k": "v"})
    assert batch.status == "validating" and batch.expires_at == batch.created_at + 24 * 3600
    shown = batch.to_openai()
    assert shown["object"] == "batch" and shown["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert "owner" not in shown and "engine" not in shown and shown["metadata"] == {"k": "v"}
    assert store.cancel("", batch.id).status == "cancelling"
    assert not store.move(batch.id, "in_progress", only_from=("validating",))
    assert store.batch("", batch.id).cancelling_at is not None
    assert store.batch(owner_of("other"), batch.id) is None


@pytest.mark.parametrize(
    ("content", "code"),
    [
        (b"", "empty_file"),
        (b"not json\n", "invalid_json_line"),
        (jsonl(request("a"), request("a")), "duplicate_custom_id"),
        (jsonl(request("a"), request("b", url="/v1/completions")), "mismatched_endpoint"),
        (jsonl({**request("a"), "method": "GET"}), "invalid_method"),
        (jsonl({"method": "POST", "url": CHAT, "body": {}}), "missing_required_parameter"),
        (jsonl(*(request(str(i)) for i in range(4))), "too_many_requests"),
        (b"\xff\xfe\n", "invalid_json_line"),
    ],
)
def test_a_bad_input_file_fails_the_batch_naming_why(content, code):
    requests, faults = input_file.read(pieces(content), CHAT, max_lines=3)
    assert requests == [] and faults[0]["code"] == code, faults


def test_a_good_input_file_keeps_its_lines_in_order():
    requests, faults = input_file.read(pieces(jsonl(request("a"), request("b", max_tokens=-1)) + b"\n"), CHAT, 3)
    assert faults == [] and [(r.line, r.custom_id) for r in requests] == [(1, "a"), (2, "b")]
    assert requests[1].body["max_tokens"] == -1  # a body the route refuses still runs: its answer is the error


def test_a_dead_workers_lines_go_back_and_a_result_counts_once(store):
    lines = Lines(store.db)
    requests, _ = input_file.read(pieces(jsonl(*(request(str(i)) for i in range(4)))), CHAT, 10)
    lines.add("batch-1", requests)
    lines.heartbeat("alive")
    first, taken = lines.claim("batch-1", "ghost", 2)  # "ghost" never beats: as good as dead
    assert [custom_id for _, custom_id, _ in taken] == ["0", "1"]
    second, retaken = lines.claim("batch-1", "alive", 10)
    assert [custom_id for _, custom_id, _ in retaken] == ["0", "1", "2", "3"]
    assert lines.claim("batch-1", "other", 10)[1] == []  # a live worker's claims stay its own
    assert not lines.record("batch-1", 1, first, 200, "r", {"late": True})  # the stale claim's result
    for line_no, _, _ in retaken:
        assert lines.record("batch-1", line_no, second, 200 if line_no < 4 else 400, f"r{line_no}", {"n": line_no})
    assert lines.open_count("batch-1") == 0
    output, errors = lines.results("batch-1", None)
    out = [json.loads(x) for x in output.decode().splitlines()]
    err = [json.loads(x) for x in errors.decode().splitlines()]
    assert [x["custom_id"] for x in out] == ["0", "1", "2"] and [x["custom_id"] for x in err] == ["3"]
    assert out[0]["response"] == {"status_code": 200, "request_id": "r1", "body": {"n": 1}}
    assert err[0]["response"]["status_code"] == 400 and err[0]["error"] is None


def test_a_worker_silent_for_an_hour_is_forgotten_when_a_new_one_first_beats(store, monkeypatch):
    lines = Lines(store.db)
    lines.heartbeat("gone")
    lines.heartbeat("alive")
    later = time.time() + FORGET_S + 1
    monkeypatch.setattr(time, "time", lambda: later)
    lines.heartbeat("alive")
    lines.heartbeat("new")
    with store.db.connect() as db:
        assert sorted(db.execute(select(tables.workers.c.id)).scalars()) == ["alive", "new"]


def test_a_line_handed_back_runs_again(store):
    lines = Lines(store.db)
    lines.add("b", input_file.read(pieces(jsonl(request("a"))), CHAT, 10)[0])
    lines.heartbeat("w")
    claim, [(line_no, _, _)] = lines.claim("b", "w", 1)
    lines.release("b", line_no, claim)
    assert lines.claim("b", "w", 1)[1][0][1] == "a"


def test_lines_that_never_ran_are_errors_with_the_end_that_stopped_them(store):
    lines = Lines(store.db)
    lines.add("b", input_file.read(pieces(jsonl(request("a"), request("b"))), CHAT, 10)[0])
    output, errors = lines.results("b", "batch_expired")
    assert output == b"" and [json.loads(x)["error"]["code"] for x in errors.decode().splitlines()] == [
        "batch_expired",
        "batch_expired",
    ]


def test_a_batch_ends_once_with_its_files_in_one_step(store):
    source = store.add_file("", "batch", "in.jsonl", jsonl(request("a")))
    batch = store.add_batch("", "static", CHAT, source.id, "24h", None)
    assert store.move(batch.id, "finalizing")
    assert store.finish(store.batch(None, batch.id), "completed", b"{}\n", b"")
    assert not store.finish(store.batch(None, batch.id), "completed", b"{}\n", b"")  # a second worker's try
    ended = store.batch("", batch.id)
    assert ended.status == "completed" and ended.error_file_id is None
    assert b"".join(store.content("", ended.output_file_id)) == b"{}\n"
    assert [f.purpose for f in store.files("", purpose="batch_output")] == ["batch_output"]


def test_a_full_disk_is_storage_full_and_keeps_nothing(tmp_path):
    """SQLite's own bound on its pages stands in for a full disk (SQLITE_FULL either way)."""
    store = Store(f"sqlite:///{tmp_path / 'small.sqlite3'}")

    @event.listens_for(store.db, "connect")
    def _small(connection, _record) -> None:
        connection.execute("PRAGMA max_page_count = 40")

    store.db.dispose()  # the connections made before the bound go
    store.add_file("", "batch", "small.jsonl", b"x" * 1000)
    with pytest.raises(StorageFull):
        store.add_file("", "batch", "big.jsonl", b"x" * 400_000)
    assert [f.filename for f in store.files("")] == ["small.jsonl"]


def test_a_table_an_older_version_made_without_a_column_stops_the_start_naming_it(tmp_path):
    url = f"sqlite:///{tmp_path}/old.sqlite3"
    with tables.connect(url).begin() as db:
        db.exec_driver_sql("DROP TABLE response_events")
        db.exec_driver_sql("CREATE TABLE response_events (response_id VARCHAR(64), seq INTEGER)")
    with pytest.raises(RuntimeError, match=r"'response_events' without the column\(s\) text"):
        tables.connect(url)
