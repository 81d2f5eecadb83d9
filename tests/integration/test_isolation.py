"""A failure that belongs to one row of a static round fails that row alone (batcher/static/
isolation.py): the real model thread and runner, one round of four, one row made to fail in its
own work (its tokenization, its stop strings, its grammar); the others finish as they do alone.
A failure of the round itself still fails every row (test_worker's injected model failure)."""

import dataclasses
import json
import queue
import threading

import pytest

from batcher import grammar
from batcher.errors import RowFailed
from batcher.sampling import SamplingParams
from batcher.sequence import Sequence, Status
from batcher.static import rows as rows_module
from service.http.state import app_state
from tests.helpers import wait_until
from tests.helpers.workers import GATE, submit, wait

GOOD = ["The capital of France is", "Water boils at", "One plus one is"]


def solo(runner, prompt: str, **params) -> str:
    alone = Sequence(prompt, SamplingParams(max_tokens=5, **params))
    runner.generate([alone], runner.encode([alone.prompt]))
    return alone.text


def one_round(worker, runner, bad: Sequence, streamed: bool = False) -> list[Sequence]:
    """`bad` and the three GOOD prompts (the first one streamed if asked) in one round: queued
    behind a held round, so that all four are waiting when the round is taken."""
    [blocker] = submit(worker, GATE)
    assert runner.entered.wait(30)
    pieces = queue.SimpleQueue() if streamed else None
    good = [Sequence(GOOD[0], SamplingParams(max_tokens=5), pieces=pieces)]
    good += [Sequence(p, SamplingParams(max_tokens=5)) for p in GOOD[1:]]
    worker.submit([good[0], bad, *good[1:]])
    runner.gate.set()
    wait([blocker, bad, *good])
    # one round: the one after the held round (a row that failed before the model ran has none)
    assert {s.round for s in good} == {blocker.round + 1} and bad.round in (None, blocker.round + 1)
    return good


def check(worker, runner_fp32, bad: Sequence, good: list[Sequence]) -> None:
    assert bad.status == Status.FAILED and isinstance(bad.error, RowFailed), bad.error
    for seq in good:
        assert seq.status == Status.FINISHED, seq.error
        assert seq.text == solo(runner_fp32, seq.prompt), seq.prompt
    assert worker.status == "ready" and worker.inflight() == 0 and worker.workload.qsize() == 0


@pytest.fixture
def poisoned_stops(monkeypatch):
    """A row whose stop strings include "<poison>" raises in its stop-string check (one row's own
    work), every other row's check runs as it does."""
    find_stop = rows_module.find_stop

    def failing(text, stops, start):
        if "<poison>" in stops:
            raise ValueError("injected stop-string failure")
        return find_stop(text, stops, start)

    monkeypatch.setattr(rows_module, "find_stop", failing)


def test_a_prompt_that_cannot_be_tokenized_fails_alone(worker, runner, runner_fp32):
    bad = Sequence("\ud800", SamplingParams(max_tokens=5))  # a lone surrogate: no UTF-8 for it
    good = one_round(worker, runner, bad)
    check(worker, runner_fp32, bad, good)
    assert "TypeError" in str(bad.error) and good[0].batch_size == 3  # the model ran the three


def test_a_row_whose_stop_strings_raise_fails_alone_and_a_stream_beside_it_streams_on(
    worker, runner, runner_fp32, poisoned_stops
):
    bad = Sequence("Tell me a story", SamplingParams(max_tokens=5, stop=("<poison>",)))
    good = one_round(worker, runner, bad, streamed=True)
    check(worker, runner_fp32, bad, good)
    assert "injected stop-string failure" in str(bad.error) and good[0].batch_size == 4
    pieces = []
    while not good[0].pieces.empty():
        pieces.append(good[0].pieces.get())
    assert pieces[-1] == (good[0], None)  # its stream ended normally, after its pieces
    assert "".join(p for _, p in pieces[:-1]) == good[0].text


def test_a_row_whose_grammar_matcher_raises_fails_alone(worker, runner, runner_fp32):
    spec = grammar.compile(grammar.StructuredSpec("regex", "[a-z]+"), runner_fp32.settings.model_path, 64 << 20)
    broken = dataclasses.replace(spec, compiled="not a compiled grammar")  # xgrammar's matcher raises
    bad = Sequence("Name a colour:", SamplingParams(max_tokens=5, structured=broken))
    good = one_round(worker, runner, bad)
    check(worker, runner_fp32, bad, good)


# --- over HTTP: the app as deployed (conftest's `app`), its static round held while they queue
def four_in_one_round(app, held_rounds, bad_body: dict, path: str = "/generate") -> tuple:
    """A bad request and three good ones sent while a round is held, so that all that reach the
    queue share the next round; returns (the bad reply, the good replies, the engine)."""
    engine, replies, threads = app_state(app).engines["static"], {}, []

    def send(name, body, where="/generate"):
        def ask():
            # json.dumps escapes what is not ASCII: a lone surrogate goes as the JSON text \ud800
            data = json.dumps({"max_tokens": 5, **body})
            replies[name] = app.test_client().post(where, data=data, content_type="application/json")

        threads.append(threading.Thread(target=ask))
        threads[-1].start()

    send("hold", {"prompts": ["Hold on"]})
    wait_until(lambda: engine.running() == 1 and engine.workload.qsize() == 0, what="the held round")
    for i, prompt in enumerate(GOOD):
        send(i, {"prompts": [prompt], "details": True})
        wait_until(lambda n=i + 1: engine.workload.qsize() == n, what=f"{i + 1} good prompts queued")
    send("bad", bad_body, path)
    wait_until(lambda: "bad" in replies or engine.workload.qsize() == 4, what="the bad one answered or queued")
    held_rounds()
    for t in threads:
        t.join(120)
    good = [replies[i] for i in range(len(GOOD))]
    assert all(r.status_code == 200 for r in good), [r.json for r in good]
    assert len({r.json["details"][0]["round"] for r in good}) == 1  # the three shared one round
    client = app.test_client()
    for prompt, reply in zip(GOOD, good, strict=True):
        alone = client.post("/generate", json={"prompts": [prompt], "max_tokens": 5}).json["generated_texts"]
        assert reply.json["generated_texts"] == alone, prompt
    health = client.get("/health").json["engines"]["static"]
    assert (health["queued"], health["running"], health["inflight"]) == (0, 0, 0)
    assert engine.workload.qsize() == 0 and not engine.workload.taken()
    return replies["bad"], good


def test_a_poison_prompt_beside_three_good_requests_harms_none_of_them(app, held_rounds):
    bad, _ = four_in_one_round(app, held_rounds, {"prompts": ["\ud800"]})
    # refused before the queue (tests/integration/test_text.py); were it not, its row would fail alone
    assert bad.status_code == 400 and bad.json["type"] == "invalid_text", bad.json


def test_a_request_whose_row_fails_in_the_round_fails_alone_on_a_stream_too(app, held_rounds, poisoned_stops):
    bad, _ = four_in_one_round(app, held_rounds, {"prompts": ["Tell me"], "stop": ["<poison>"]})
    assert bad.status_code == 500 and "injected stop-string failure" in bad.json["error"], bad.json
    stream, _ = four_in_one_round(app, held_rounds, {"prompt": "Tell me", "stop": ["<poison>"]}, "/generate_stream")
    # failed before its first event: the stream's own 500 (after it, an error event would say so)
    assert stream.status_code == 500 and "injected stop-string failure" in stream.get_data(as_text=True)
