"""/metrics counts a batch's lines by state on its engine while it runs, and the batch by status
(service/jobs/metrics.py), as the app serves them: the session's app, its runner, its store."""

from __future__ import annotations

import json

from prometheus_client.parser import text_string_to_metric_families

from service.http.state import app_state
from tests.helpers import wait_until

CHAT = "/v1/chat/completions"
STATES = ("pending", "running", "done_ok", "done_error")


def scrape(app) -> dict[tuple[str, str, str], float]:
    """(name, engine, state or status) -> value of the batch series in /metrics."""
    text = app.test_client().get("/metrics").get_data(as_text=True)
    shown = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in ("batch_lines", "batches"):
                shown[s.name, s.labels["engine"], s.labels.get("state", s.labels.get("status"))] = s.value
    return shown


def lines_on(shown: dict, engine: str) -> list[float]:
    return [shown["batch_lines", engine, state] for state in STATES]


def test_metrics_count_a_running_batchs_lines_then_the_batch_it_ends(app, held_rounds):
    state = app_state(app)
    before = scrape(app)
    bad = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}  # a 400 from the route
    good = [{"messages": [{"role": "user", "content": f"Say {i}."}], "max_tokens": 3} for i in range(6)]
    items = [{"custom_id": f"c{i}", "method": "POST", "url": CHAT, "body": body} for i, body in enumerate([bad, *good])]
    content = "".join(json.dumps(item) + "\n" for item in items).encode()
    source = state.store.add_file("", "batch", "lines.jsonl", content)
    batch = state.store.add_batch("", "static", CHAT, source.id, "24h", None)
    state.runner.kick()

    # the rounds are held: the bad line is answered (no round needed), the good ones wait claimed or pending
    def held() -> bool:
        now, then = lines_on(scrape(app), "static"), lines_on(before, "static")
        pending, running, ok, error = (a - b for a, b in zip(now, then, strict=True))
        return error == 1 and ok == 0 and running >= 1 and pending + running == len(good)

    wait_until(held, 120, "the batch's lines counted while its rounds are held")
    assert scrape(app)["batches", "static", "in_progress"] == before["batches", "static", "in_progress"] + 1

    held_rounds()
    done = state.runner.wait_for(batch.id, {"completed", "failed"}, 300)
    assert done is not None and done.status == "completed", state.store.batch(None, batch.id)
    after = scrape(app)
    assert lines_on(after, "static") == lines_on(before, "static")  # an ended batch's lines leave the count
    assert after["batches", "static", "completed"] == before["batches", "static", "completed"] + 1
    assert after["batches", "static", "in_progress"] == before["batches", "static", "in_progress"]
