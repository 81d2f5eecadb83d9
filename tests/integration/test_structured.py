"""Structured outputs in this process: one static round with constrained and unconstrained rows
side by side (in an app of its own, where the test holds the round fence), the per-row mask on the
Runner itself, and one grammar compiler per process. Over HTTP on both engines:
tests/e2e/test_structured.py."""

from __future__ import annotations

import json
import re
import threading

import pytest

from batcher import fence, grammar
from batcher.grammar import StructuredSpec
from batcher.sampling import SamplingParams
from batcher.sequence import Sequence
from batcher.static import decode
from service import create_app, shutdown
from service.config import Config
from service.http.state import app_state
from service.structured import cache_limit_bytes
from tests.helpers import wait_until
from tests.helpers.apps import post

DATE = r"\d{4}-\d{2}-\d{2}"
LIMIT = cache_limit_bytes(Config())  # the grammar cache's cap, as the service sets it


# --- one static round, constrained and unconstrained rows side by side --------------------------
@pytest.fixture(scope="module")
def static_app():
    """The static engine alone, in this process: the test holds its round fence."""
    app = create_app(Config.from_env(vllm_enabled=False, dtype="float32"))
    assert app_state(app).engines["static"].wait_ready(120)
    yield app
    shutdown(app)


def test_a_mixed_static_round_answers_both_rows_in_one_generate_call(static_app):
    engine, replies, threads = app_state(static_app).engines["static"], {}, []
    plain = {"prompts": ["The capital of France is"], "max_tokens": 12, "details": True}
    dated = {
        "prompts": ["When did the Berlin wall fall?"],
        "max_tokens": 12,
        "details": True,
        "structured_outputs": {"regex": DATE},
    }
    alone = post(static_app.test_client(), "/generate", plain).json["generated_texts"][0]

    def send(name, body):
        threads.append(
            threading.Thread(target=lambda: replies.update({name: post(static_app.test_client(), "/generate", body)}))
        )
        threads[-1].start()

    calls, original = [], decode.generate

    def counted(model, step, inputs, *args):
        calls.append(inputs["input_ids"].shape[0])
        return original(model, step, inputs, *args)

    lock = fence.static_round()
    assert lock.acquire(timeout=600)
    decode.generate = counted
    try:
        send("blocker", {"prompts": ["Hold on"], "max_tokens": 2})  # its round waits for the fence
        wait_until(lambda: engine.running() == 1 and engine.workload.qsize() == 0, what="the held round")
        send("dated", dated)
        send("plain", plain)
        wait_until(lambda: engine.workload.qsize() == 2, what="both queued behind it")
    finally:
        lock.release()
        for t in threads:
            t.join(120)
        decode.generate = original
    assert calls == [1, 2]  # the blocker's round, then one generate() for both rows
    d, p = replies["dated"].json, replies["plain"].json
    assert d["details"][0]["round"] == p["details"][0]["round"] and d["details"][0]["batch_size"] == 2
    assert re.fullmatch(DATE, d["generated_texts"][0]) and d["details"][0]["finish_reason"] == "stop"
    assert p["generated_texts"][0] == alone


# --- the per-row mask on the Runner itself ------------------------------------------------------
def test_the_runner_masks_only_the_constrained_rows_of_a_round(runner_fp32, model_path):
    def spec(kind: str, value) -> StructuredSpec:
        return grammar.compile(StructuredSpec(kind, value), model_path, LIMIT)

    prompts = ["Is water wet? Answer:", "The capital of France is", "The date today is", "Once upon a time"]
    choice, date = spec("choice", ("yes", "no")), spec("regex", DATE)
    seqs = [
        Sequence(prompts[0], SamplingParams(max_tokens=10, structured=choice, logprobs=0)),
        Sequence(prompts[1], SamplingParams(max_tokens=10)),
        Sequence(prompts[2], SamplingParams(max_tokens=16, temperature=1.0, seed=5, structured=date)),
        Sequence(prompts[3], SamplingParams(max_tokens=10, presence_penalty=1.0)),
    ]
    reasons = runner_fp32.generate(seqs, runner_fp32.encode(prompts))
    assert (seqs[0].text, reasons[0]) in (("yes", "stop"), ("no", "stop"))
    assert len(seqs[0].logprobs) == len(seqs[0].token_ids)  # logprobs compose with the mask
    assert re.fullmatch(DATE, seqs[2].text) and reasons[2] == "stop"
    for row in (1, 3):  # the unconstrained rows answer what they answer alone
        again = Sequence(prompts[row], seqs[row].params)
        again_reasons = runner_fp32.generate([again], runner_fp32.encode([prompts[row]]))
        assert (again.text, again_reasons[0]) == (seqs[row].text, reasons[row])
    # a spec compiles once per process: the second time, xgrammar's cache answers and grows no more
    cache = grammar.compiler(model_path, LIMIT)
    size = cache.get_cache_size_bytes()
    spec("choice", ("yes", "no"))
    assert size > 0 and cache.get_cache_size_bytes() == size
    with pytest.raises(grammar.GrammarError):
        spec("regex", "(")


def test_tokens_a_grammar_forbids_get_vllms_floor_not_minus_infinity(runner_fp32, model_path):
    """More alternatives asked than the grammar allows: the rest are impossible (-inf), which JSON
    cannot carry; vLLM's server reports -9999.0 for them, and so do we."""
    a_or_b = grammar.compile(StructuredSpec("choice", ("A", "B")), model_path, LIMIT)  # 2 tokens allowed
    seq = Sequence("Pick A or B:", SamplingParams(max_tokens=4, structured=a_or_b, logprobs=5))
    runner_fp32.generate([seq], runner_fp32.encode([seq.prompt]))
    first = seq.logprobs[0]
    assert first.top[-1][2] == -9999.0 and first.logprob > -9999.0
    json.dumps([[r.logprob, [lp for _, _, lp in r.top]] for r in seq.logprobs], allow_nan=False)


def test_requests_that_arrive_together_build_the_grammar_compiler_once(model_path, monkeypatch):
    """The first structured requests of a process arrive together (ten tool calls at once): the
    second waits for the first's compiler instead of building its own tokenizer and TokenizerInfo
    (ten builds took 18 s on one core against 1 s for one). The first build is held inside
    TokenizerInfo until the second caller has had 2 s to reach it; a new key (the same folder
    spelled another way) so that this process's cached compiler is not the one tested."""
    import xgrammar as xgr

    build, inside, release, builds = xgr.TokenizerInfo.from_huggingface, threading.Event(), threading.Event(), []

    def held(*args, **kwargs):
        builds.append(threading.get_ident())
        inside.set()
        assert release.wait(60)
        return build(*args, **kwargs)

    monkeypatch.setattr(xgr.TokenizerInfo, "from_huggingface", held)
    path = model_path.rstrip("/") + "/."
    callers = [threading.Thread(target=grammar.compiler, args=(path, LIMIT)) for _ in range(2)]
    try:
        callers[0].start()
        assert inside.wait(60)
        callers[1].start()
        callers[1].join(2)  # it has not built one of its own meanwhile: it waits on the first's
        assert callers[1].is_alive() and len(builds) == 1, builds
    finally:
        release.set()
        for caller in callers:
            caller.join(60)
    assert len(builds) == 1 and grammar.compiler(path, LIMIT) is grammar.compiler(path, LIMIT)
