"""The stored responses (service/openai/responses/stored.py) on a real SQLite database: a
conversation read back in order, each key's own, kept for the retention and then gone, expired
rows deleted by later writes, a conversation's length bounded; a background one claimed by one
worker, taken over from a dead one, written only under its claim. Time is the store's clock seam.
The same on PostgreSQL: tests/integration/test_responses_postgres.py."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import func, select

from service.errors import InvalidRequest
from service.jobs import tables
from service.jobs.lines import STALE_S, Lines
from service.openai.responses.stored import ResponseStore, with_ids
from service.openai.storage import NotFound

DAY = 86400


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store(tmp_path, clock):
    return ResponseStore(tables.connect(f"sqlite:///{tmp_path}/db.sqlite3"), retention_s=30 * DAY, clock=clock)


def turn(store, owner, rid, said, answered, previous=None):
    out = {"type": "message", "id": f"msg_{rid}", "role": "assistant", "status": "completed"}
    out["content"] = [{"type": "output_text", "text": answered, "annotations": []}]
    response = {"id": rid, "created_at": 0, "previous_response_id": previous, "output": [out], "status": "completed"}
    store.add(owner, response, with_ids([{"role": "user", "content": said}]))
    return response


def texts(items):
    return [item["content"][0]["text"] for item in items]


def rows(store) -> int:
    with store.db.connect() as db:
        return db.execute(select(func.count()).select_from(tables.responses)).scalar()


def test_a_conversation_reads_back_oldest_first_each_item_with_an_id(store):
    turn(store, "a", "r1", "Hi", "Hello")
    turn(store, "a", "r2", "France?", "Paris", previous="r1")
    turn(store, "a", "r3", "Germany?", "Berlin", previous="r2")
    assert texts(store.history("a", "r3")) == ["Hi", "Hello", "France?", "Paris", "Germany?", "Berlin"]
    items = store.input_items("a", "r3")
    assert texts(items) == ["Hi", "Hello", "France?", "Paris", "Germany?"]
    assert all(item["id"] for item in items) and len({item["id"] for item in items}) == len(items)
    assert items[0]["content"] == [{"type": "input_text", "text": "Hi"}]
    assert store.get("a", "r2")["output"][0]["content"][0]["text"] == "Paris"


def test_another_keys_response_is_absent_everywhere(store):
    turn(store, "a", "r1", "Hi", "Hello")
    for read in (store.get, store.input_items, store.delete, store.history):
        with pytest.raises(NotFound):
            read("b", "r1")
    assert store.get("a", "r1")["id"] == "r1"  # b's delete removed nothing


def test_a_deleted_turn_breaks_the_conversation_after_it_with_a_404_naming_it(store):
    turn(store, "a", "r1", "Hi", "Hello")
    turn(store, "a", "r2", "France?", "Paris", previous="r1")
    store.delete("a", "r1")
    with pytest.raises(NotFound) as gone:
        store.history("a", "r2")
    assert gone.value.param == "previous_response_id" and "'r1'" in str(gone.value)
    with pytest.raises(NotFound):
        store.delete("a", "r1")


def test_a_response_is_kept_for_the_retention_then_gone_and_later_writes_delete_it(store, clock):
    turn(store, "a", "r1", "Hi", "Hello")
    clock.now += 30 * DAY - 1
    assert store.get("a", "r1")["id"] == "r1"
    clock.now += 1
    with pytest.raises(NotFound):
        store.get("a", "r1")
    assert rows(store) == 1  # expired, not yet deleted: no read shows it
    turn(store, "a", "r2", "Hi again", "Hello")
    assert rows(store) == 1  # the write deleted the expired row


def test_a_conversation_longer_than_the_room_is_a_400_naming_previous_response_id(store):
    previous = None
    for n in range(4):
        previous = turn(store, "a", f"r{n}", "Hi", "Hello", previous=previous)["id"]
    assert len(store.history("a", previous, room=8)) == 8
    with pytest.raises(InvalidRequest) as long:
        store.history("a", previous, room=7)
    assert long.value.param == "previous_response_id"


def queued(store, rid="q1", owner="a", engine="static"):
    response = {"id": rid, "created_at": 0, "status": "queued", "background": True, "output": []}
    store.add(owner, response, with_ids([{"role": "user", "content": "Hi"}]), engine=engine, body={"input": "Hi"})


def test_a_background_response_is_claimed_once_and_taken_over_from_a_dead_worker(store, monkeypatch):
    lines = Lines(store.db)
    lines.heartbeat("w1")
    lines.heartbeat("w2")
    queued(store)
    assert store.claim("w1", ["vllm"]) is None  # another engine's
    job = store.claim("w1", ["static"])
    assert job is not None and job.body == {"input": "Hi"} and store.claim("w2", ["static"]) is None
    assert store.record(job, 0, "event: a\n\n")
    later = time.time() + STALE_S + 1  # w1 went silent; w2 beats on
    monkeypatch.setattr(time, "time", lambda: later)
    lines.heartbeat("w2")
    taken = store.claim("w2", ["static"])
    assert taken is not None and taken.claim != job.claim
    assert store.events("a", "q1", -1)[0] == []  # the dead run's events dropped: it runs again from the start
    assert not store.record(job, 1, "event: b\n\n")  # the dead run writes nothing more
    end = {"id": "q1", "status": "completed", "output": []}
    assert store.record(taken, 0, "event: done\n\n", end)
    assert store.get("a", "q1")["status"] == "completed" and store.claim("w2", ["static"]) is None
    assert store.events("a", "q1", -1)[0] == [(0, "event: done\n\n")]


def test_a_cancel_takes_the_claim_away_and_a_release_queues_it_again(store):
    Lines(store.db).heartbeat("w1")
    queued(store, "q1")
    queued(store, "q2")
    first, second = store.claim("w1", ["static"]), store.claim("w1", ["static"])
    assert (first.id, second.id) == ("q1", "q2")  # oldest first
    assert store.cancel("a", "q1")["status"] == "cancelled"
    assert not store.record(first, 0, "event: a\n\n")
    store.release(second)
    assert store.get("a", "q2")["status"] == "queued" and store.claim("w1", ["static"]).id == "q2"
    turn(store, "a", "r1", "Hi", "Hello")
    with pytest.raises(InvalidRequest):
        store.cancel("a", "r1")  # not a background one
