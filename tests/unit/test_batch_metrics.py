"""/metrics' batch series (service/jobs/metrics.py) over a store without a model: the lines of
running batches by engine and state, each batch by engine and status, every series there at 0."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from service.jobs import input_file
from service.jobs.lines import Lines
from service.jobs.metrics import BatchCollector
from service.jobs.store import Store

CHAT = "/v1/chat/completions"


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(f"sqlite:///{tmp_path / 'jobs.sqlite3'}")


def scrape(store: Store) -> dict[tuple[str, tuple], float]:
    """(name, sorted labels) -> value, as a scrape reads them."""
    registry = CollectorRegistry()
    registry.register(BatchCollector(store))
    families = text_string_to_metric_families(generate_latest(registry).decode())
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def line(engine: str, state: str) -> tuple[str, tuple]:
    return "batch_lines", (("engine", engine), ("state", state))


def batches(engine: str, status: str) -> tuple[str, tuple]:
    return "batches", (("engine", engine), ("status", status))


def running_batch(store: Store, engine: str, count: int):
    items = [{"custom_id": f"c{i}", "method": "POST", "url": CHAT, "body": {"messages": []}} for i in range(count)]
    content = "".join(json.dumps(item) + "\n" for item in items).encode()
    batch = store.add_batch("", engine, CHAT, store.add_file("", "batch", "in.jsonl", content).id, "24h", None)
    requests, faults = input_file.read([content], CHAT, 100)
    assert not faults
    Lines(store.db).add(batch.id, requests)
    store.move(batch.id, "in_progress")
    return batch


def test_every_series_is_there_at_zero_before_any_batch(store):
    shown = scrape(store)
    assert len(shown) == 2 * (4 + 8) and set(shown.values()) == {0}
    assert shown[line("vllm", "pending")] == 0 and shown[batches("static", "cancelled")] == 0


def test_lines_count_by_engine_and_state_while_their_batch_runs(store):
    lines = Lines(store.db)
    static = running_batch(store, "static", 5)
    running_batch(store, "vllm", 2)
    claim, taken = lines.claim(static.id, "w1", 3)
    assert len(taken) == 3
    lines.record(static.id, taken[0][0], claim, 200, "r0", {"ok": True})
    lines.record(static.id, taken[1][0], claim, 400, "r1", {"error": {}})
    shown = scrape(store)
    assert [shown[line("static", s)] for s in ("pending", "running", "done_ok", "done_error")] == [2, 1, 1, 1]
    assert [shown[line("vllm", s)] for s in ("pending", "running", "done_ok", "done_error")] == [2, 0, 0, 0]
    assert shown[batches("static", "in_progress")] == shown[batches("vllm", "in_progress")] == 1

    store.move(static.id, "completed")  # an ended batch's lines leave batch_lines; the batch counts on
    shown = scrape(store)
    assert sum(shown[line("static", s)] for s in ("pending", "running", "done_ok", "done_error")) == 0
    assert shown[batches("static", "completed")] == 1 and shown[batches("static", "in_progress")] == 0


def test_a_cancelling_batch_still_counts_its_lines(store):
    batch = running_batch(store, "static", 3)
    assert store.cancel("", batch.id).status == "cancelling"
    shown = scrape(store)
    assert shown[line("static", "pending")] == 3 and shown[batches("static", "cancelling")] == 1
