"""Sampling controls on the real model, each test on both engines: stop, n, seed, logprobs,
penalties and filters, and static-vs-vLLM parity with them."""

import json
import logging
from concurrent.futures import ThreadPoolExecutor

import pytest

from batcher.sampling import SamplingParams
from batcher.sequence import Sequence
from batcher.static import decode
from service.generation import fan_out
from service.http.state import app_state
from tests.helpers import wait_until
from tests.helpers.apps import post

ENGINES = {"static": ("/generate", "/generate_stream"), "vllm": ("/generate_vllm", "/generate_vllm_stream")}
PARIS = "The capital of France is"
STORY = "Once upon a time, in a small village,"
REPETITIVE = "Say it again and again: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat,"


@pytest.fixture(params=list(ENGINES))
def engine(request, app):
    """(the client, the generate path, the stream path) of one engine; only the vLLM one waits
    for vLLM to start. `app` is named so that these tests join the session app's xdist group
    (tests/conftest.py groups by the fixtures a test names): asked for only inside, it put them
    in a group of their own, which started a second app on the other worker (~30 s)."""
    client = request.getfixturevalue("vllm_client" if request.param == "vllm" else "client")
    return client, *ENGINES[request.param]


def generate(engine, **body):
    client, path, _ = engine
    r = post(client, path, {"details": True, **body})
    assert r.status_code == 200, r.json
    return r.json


def generate_at_once(engine, *bodies: dict) -> list[dict]:
    """`generate` for each body, all sent at once, so that the engine batches them (a static round
    takes the rows waiting when it starts; vLLM admits each at its next step): each row keeps its
    own parameters, so what each asserts is what it would be alone, and one round does the work
    of several. Each from its own client: one Flask test client per thread."""
    client, *paths = engine
    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda body: generate((client.application.test_client(), *paths), **body), bodies))


def stream_events(engine, **body):
    client, _, path = engine
    r = post(client, path, body)
    assert r.status_code == 200, r.json
    return [json.loads(line[len("data: ") :]) for line in r.text.split("\n\n") if line.startswith("data: ")]


def token_texts(engine, prompt, max_tokens):
    """The greedy completion's tokens as text, from its logprobs."""
    reply = generate(engine, prompts=[prompt], max_tokens=max_tokens, logprobs=0, ignore_eos=True)
    return [t["token"] for t in reply["logprobs"][0]]


# --- stop --------------------------------------------------------------------------------------
def test_a_multi_token_stop_string_split_across_tokens_ends_the_text_before_it(engine):
    pieces = token_texts(engine, STORY, 24)
    full = "".join(pieces)
    # from the middle of token 6 to the middle of token 9: several tokens, cut on both ends
    start = len("".join(pieces[:6])) + len(pieces[6]) // 2
    stop = full[start : len("".join(pieces[:9])) + max(1, len(pieces[9]) // 2)]
    assert len(stop) >= 4 and full.find(stop) == start
    reply = generate(engine, prompts=[STORY], max_tokens=24, stop=["never in this text", stop])
    assert reply["generated_texts"] == [full[:start]]
    assert reply["details"][0]["finish_reason"] == "stop"
    assert reply["details"][0]["tokens"] <= 10  # generation really ended there


def test_a_stream_never_sends_text_of_a_stop_string(engine):
    pieces = token_texts(engine, STORY, 24)
    full = "".join(pieces)
    start = len("".join(pieces[:5])) + 1  # one character into token 5
    stop = full[start : len("".join(pieces[:8]))]
    events = stream_events(engine, prompt=STORY, max_tokens=24, stop=stop)
    sent = "".join(e.get("token", "") for e in events)
    assert sent == full[:start]  # a stream cannot take back text: nothing of the stop went out
    assert events[-1]["finish_reason"] == "stop" and events[-1]["done"]


def test_stop_token_ids_end_the_text_with_reason_stop(engine):
    reply = generate(engine, prompts=[PARIS], max_tokens=12, logprobs=0, ignore_eos=True)
    tokens = [t["token_id"] for t in reply["logprobs"][0]]
    at = next(i for i in range(2, len(tokens)) if tokens[i] not in tokens[:i])  # its first appearance
    stopped = generate(engine, prompts=[PARIS], max_tokens=12, stop_token_ids=[tokens[at]], ignore_eos=True, logprobs=0)
    assert stopped["generated_texts"][0] == "".join(t["token"] for t in reply["logprobs"][0][:at])
    assert stopped["details"][0]["finish_reason"] == "stop"
    # the stop token has no text, but it was generated: its record comes last, as on vLLM
    assert [t["token_id"] for t in stopped["logprobs"][0]] == tokens[: at + 1]
    assert stopped["details"][0]["tokens"] == at + 1


# --- n -----------------------------------------------------------------------------------------
def test_n_gives_n_texts_per_prompt_grouped_per_prompt(engine):
    bodies = [{"prompts": [p], "max_tokens": 8} for p in (PARIS, STORY)] + [
        {"prompts": [PARIS, STORY], "max_tokens": 8, "n": 3}
    ]
    *alone, reply = generate_at_once(engine, *bodies)
    alone = [a["generated_texts"][0] for a in alone]
    assert reply["generated_texts"] == [alone[0]] * 3 + [alone[1]] * 3  # greedy: three equal
    assert len({d["sequence_id"] for d in reply["details"]}) == 6  # each its own sequence


# --- seed --------------------------------------------------------------------------------------
def test_the_same_seed_gives_the_same_text_whatever_shares_the_round(engine):
    body = {"max_tokens": 32, "temperature": 1.0, "seed": 1234, "ignore_eos": True}
    shared = generate(engine, prompts=[PARIS, STORY, "Hi"], **body)  # a round of its own three
    assert len({d["batch_size"] for d in shared["details"]}) == 1 and shared["details"][1]["batch_size"] == 3
    # then the same seed twice, another seed and n=2, at once: in rounds of their own making
    first, again, other_seed, n = (
        reply["generated_texts"]
        for reply in generate_at_once(
            engine,
            {"prompts": [STORY], **body},
            {"prompts": [STORY], **body},
            {"prompts": [STORY], **{**body, "seed": 4321}},
            {"prompts": [STORY], "n": 2, **body},
        )
    )
    assert first == again == [shared["generated_texts"][1]]
    assert other_seed != first
    assert n[0] == first[0] and n[1] != first[0]  # the second of n draws with seed + 1, as vLLM does


# --- logprobs ----------------------------------------------------------------------------------
def test_logprobs_have_one_record_per_token_with_sorted_alternatives(engine):
    reply = generate(engine, prompts=[PARIS, STORY], max_tokens=6, logprobs=3, ignore_eos=True)
    for text, records in zip(reply["generated_texts"], reply["logprobs"], strict=True):
        assert len(records) == 6 and "".join(r["token"] for r in records) == text
        for r in records:
            top = [t["logprob"] for t in r["top_logprobs"]]
            assert len(top) == 3 and top == sorted(top, reverse=True) and all(lp <= 0 for lp in top)
            assert r["token_id"] == r["top_logprobs"][0]["token_id"]  # greedy: the chosen is the top
            assert r["logprob"] == pytest.approx(top[0], abs=1e-6)
    assert "logprobs" not in generate(engine, prompts=[PARIS], max_tokens=2)  # only when asked


def test_sampled_logprobs_are_the_models_own_distribution(engine):
    """Raw logprobs (vLLM's default): temperature does not change them."""
    body = {"prompts": [PARIS], "max_tokens": 1, "logprobs": 2}
    greedy = generate(engine, **body)["logprobs"][0][0]
    hot = generate(engine, **body, temperature=2.0, top_k=1)["logprobs"][0][0]  # top_k 1: same token
    assert hot["token_id"] == greedy["token_id"] and hot["logprob"] == pytest.approx(greedy["logprob"], abs=1e-4)


# --- penalties and filters ---------------------------------------------------------------------
def repeats(engine, *penalties: dict) -> list[int]:
    """How many of the 40 tokens repeat an earlier one, for each of `penalties` (sent at once)."""
    body = {"prompts": [REPETITIVE], "max_tokens": 40, "logprobs": 0, "ignore_eos": True}
    replies = generate_at_once(engine, *({**body, **penalty} for penalty in penalties))
    ids = [[r["token_id"] for r in reply["logprobs"][0]] for reply in replies]
    return [len(row) - len(set(row)) for row in ids]


PENALTIES = [{"presence_penalty": 1.5}, {"frequency_penalty": 1.5}, {"repetition_penalty": 1.5}]


def test_each_penalty_makes_a_repetitive_completion_repeat_less(engine):
    # the plain completion and one per penalty, at once: one round of four on the static engine
    plain, *penalized = repeats(engine, {}, *PENALTIES)
    assert plain >= 15  # the prompt makes the model loop
    for penalty, count in zip(PENALTIES, penalized, strict=True):
        assert count < plain / 2, penalty


def test_a_negative_penalty_makes_it_repeat_more(engine):
    body = {"prompts": [STORY], "max_tokens": 40, "logprobs": 0, "ignore_eos": True}
    reply, more = generate_at_once(engine, body, {**body, "presence_penalty": -2})
    ids = [r["token_id"] for r in reply["logprobs"][0]]
    more_ids = [r["token_id"] for r in more["logprobs"][0]]
    assert len(set(more_ids)) < len(set(ids))


def test_logit_bias_and_top_k_min_p_and_min_tokens(engine):
    greedy = generate(engine, prompts=[PARIS], max_tokens=6, logprobs=1)
    first = greedy["logprobs"][0][0]
    # the rest at once, each row with its own parameters
    banned, forced, top_k, min_p, short, longer = generate_at_once(
        engine,
        {"prompts": [PARIS], "max_tokens": 6, "logprobs": 0, "logit_bias": {str(first["token_id"]): -100}},
        {"prompts": [PARIS], "max_tokens": 3, "logprobs": 0, "logit_bias": {"28": 100}},
        # only the top token survives either of these: sampling is greedy
        {"prompts": [PARIS], "max_tokens": 6, "temperature": 1.0, "top_k": 1},
        {"prompts": [PARIS], "max_tokens": 6, "temperature": 1.0, "min_p": 1.0},
        {"prompts": ["Write one word."], "max_tokens": 30},
        {"prompts": ["Write one word."], "max_tokens": 30, "min_tokens": 12},
    )
    assert banned["logprobs"][0][0]["token_id"] != first["token_id"]
    assert [r["token_id"] for r in forced["logprobs"][0]] == [28, 28, 28]
    assert top_k["generated_texts"] == min_p["generated_texts"] == greedy["generated_texts"]
    assert short["details"][0]["finish_reason"] == "stop" and short["details"][0]["tokens"] < 12
    assert longer["details"][0]["tokens"] >= 12


# --- parity and errors -------------------------------------------------------------------------
def test_static_and_vllm_agree_on_greedy_with_stop_and_logprobs(client, vllm_client):
    body = {"prompts": [PARIS, STORY, "def fibonacci(n):"], "max_tokens": 16, "stop": ["\n", "."], "logprobs": 2}
    body["details"] = True
    static, vllm = post(client, "/generate", body).json, post(vllm_client, "/generate_vllm", body).json
    assert static["generated_texts"] == vllm["generated_texts"]
    assert [d["finish_reason"] for d in static["details"]] == [d["finish_reason"] for d in vllm["details"]]
    assert "stop" in [d["finish_reason"] for d in static["details"]]
    for s_records, v_records in zip(static["logprobs"], vllm["logprobs"], strict=True):
        assert [r["token_id"] for r in s_records] == [r["token_id"] for r in v_records]
        assert [r["token"] for r in s_records] == [r["token"] for r in v_records]
        for s, v in zip(s_records, v_records, strict=True):
            assert s["logprob"] == pytest.approx(v["logprob"], abs=1e-3)
            assert [t["token_id"] for t in s["top_logprobs"]] == [t["token_id"] for t in v["top_logprobs"]]


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/generate", {"prompts": ["ok"], "n": 9}, "n"),
        ("/generate", {"prompts": ["ok"], "stop": 5}, "stop"),
        ("/generate", {"prompts": ["ok"], "logit_bias": {"999999": 1}}, "logit_bias"),  # beyond the vocabulary
        ("/generate", {"prompts": ["ok"], "stop_token_ids": [999999]}, "stop_token_ids"),
        ("/generate_stream", {"prompt": "ok", "n": 2}, "n"),
        ("/basic_generate", {"prompt": "ok", "n": 2}, "n"),
    ],
)
@pytest.mark.parametrize("engine_name", list(ENGINES))
def test_bad_sampling_values_get_422_naming_the_field_and_enqueue_nothing(vllm_app, path, body, param, engine_name):
    if engine_name == "vllm":
        path = {"/generate": "/generate_vllm", "/generate_stream": "/generate_vllm_stream"}.get(path)
        if path is None:
            pytest.skip("no vLLM twin of /basic_generate")
    r = post(vllm_app.test_client(), path, body)
    assert r.status_code == 422 and r.json["type"] == "invalid_request" and param in r.json["error"], r.json
    assert all(eng.inflight() == 0 for eng in app_state(vllm_app).engines.values())


def test_a_mixed_static_round_is_one_generate_call(app, caplog, monkeypatch):
    """greedy, seeded sampling with logprobs, stop and n=2, all in one round: one round line."""
    engine = app_state(app).engines["static"]
    seqs = [
        Sequence(PARIS, SamplingParams(max_tokens=8)),
        Sequence(STORY, SamplingParams(max_tokens=8, temperature=1.0, seed=3, logprobs=2)),
        *fan_out([STORY], SamplingParams(max_tokens=8, stop=(",",), presence_penalty=0.5), n=2),
    ]
    assert len(seqs) == engine.batch_size
    # the app is shared: a round an earlier test left running would be counted below (CI saw one)
    wait_until(lambda: engine.inflight() == 0, what="the static engine idle")
    calls = []
    original = decode.generate

    def counted(model, step, inputs, *args):
        calls.append(inputs["input_ids"].shape)
        return original(model, step, inputs, *args)

    monkeypatch.setattr(decode, "generate", counted)
    with caplog.at_level(logging.INFO, logger="batcher.static.worker"):
        engine.submit(seqs)
        for seq in seqs:
            assert seq.done.wait(120)
    monkeypatch.undo()
    rounds = [r.getMessage() for r in caplog.records if "Batch input shape" in r.getMessage()]
    rounds = [line for line in rounds if any(f"'{seq.id}'" in line for seq in seqs)]  # ours alone
    assert len(rounds) == 1 and all(seq.id in rounds[0] for seq in seqs)
    assert len(calls) == 1 and calls[0][0] == 4
    assert {seq.round for seq in seqs} == {seqs[0].round}
    assert len(seqs[1].logprobs) == len(seqs[1].token_ids) == 8
    assert all(seq.finish_reason in ("stop", "length") for seq in seqs)
