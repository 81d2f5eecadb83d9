"""What batching cost each response (service/batching.py): in the demo routes' details and the
OpenAI routes' `batching` extension, on both engines, with the real app and model."""

import threading

from service.http.state import app_state
from tests.helpers import wait_until
from tests.helpers.apps import post

SHORT, LONG = "Hi", "Tell me, in many more words than the other prompt has, about the sea"


def test_a_static_row_that_ends_first_sits_finished_and_pays_the_rounds_padding(app, held_rounds):
    engine, replies = app_state(app).engines["static"], {}

    def send(name, body):
        def ask():
            replies[name] = post(app.test_client(), "/generate", {**body, "details": True, "ignore_eos": True})

        thread = threading.Thread(target=ask)
        thread.start()
        return thread

    threads = [send("hold", {"prompts": ["Hold on"], "max_tokens": 2})]
    wait_until(lambda: engine.running() == 1, what="the held round")
    threads.append(send("short", {"prompts": [SHORT], "max_tokens": 2}))
    wait_until(lambda: engine.workload.qsize() == 1, what="the short prompt queued")
    threads.append(send("long", {"prompts": [LONG], "max_tokens": 16}))
    wait_until(lambda: engine.workload.qsize() == 2, what="the long prompt queued")
    held_rounds()  # the held round, then one round of the short and the long prompt
    for t in threads:
        t.join(120)
    [short], [long] = replies["short"].json["details"], replies["long"].json["details"]
    assert short["round"] == long["round"] and short["shared_with"] == long["shared_with"] == 1
    assert short["padding_tokens"] == long["padding_tokens"] > 0  # the short prompt's pad, left of it
    assert short["finished_wait_ms"] > long["finished_wait_ms"]  # it ended 14 steps before the round did
    assert "prefilled_ahead" not in short


def test_vllm_details_count_the_prompts_that_prefilled_ahead(vllm_client):
    r = post(vllm_client, "/generate_vllm", {"prompts": ["a", "b", "c"], "max_tokens": 2, "details": True})
    details = r.json["details"]
    assert [d["prefilled_ahead"] for d in details] == [0, 1, 2]
    assert all(d["round"].startswith("step-") and "padding_tokens" not in d for d in details)


def test_openai_routes_show_batching_only_when_details_is_asked(vllm_client):
    for base, key in (("/static/v1", "padding_tokens"), ("/v1", "prefilled_ahead")):
        body = {"prompt": ["The capital of France is", "Hi"], "max_tokens": 3, "temperature": 0}
        plain = post(vllm_client, f"{base}/completions", body).json
        assert "batching" not in plain
        costs = post(vllm_client, f"{base}/completions", {**body, "details": True}).json["batching"]
        assert len(costs) == 2 and all(key in c and c["queue_ms"] >= 0 for c in costs)
        assert costs[0]["shared_with"] >= 1  # the two prompts ran together
