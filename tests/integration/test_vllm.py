"""The continuous-batching path with the real in-process vLLM engine and the default model."""

import dataclasses
import logging
import threading

import pytest

from service.http.state import app_state
from tests.helpers import wait_until
from tests.helpers.apps import own_app, post

PROMPTS = [
    "The capital of France is",
    "Water boils at a temperature of",
    "The largest planet in the solar system is",
    "Once upon a time",
    "def fibonacci(n):",
]


def test_one_prompt(vllm_client):
    r = post(vllm_client, "/generate_vllm", {"prompts": ["The capital of France is"], "max_tokens": 5})
    assert r.status_code == 200
    assert r.json["generated_texts"][0].startswith(" Paris")


def test_several_prompts_in_order_with_details(vllm_client):
    r = post(vllm_client, "/generate_vllm", {"prompts": PROMPTS[:3], "max_tokens": 4, "details": True})
    assert r.status_code == 200
    texts, details = r.json["generated_texts"], r.json["details"]
    assert len(texts) == 3 and all(texts)
    assert [d["tokens"] for d in details] == [4, 4, 4]
    assert all(d["finish_reason"] == "length" for d in details)


def test_empty_list_and_invalid_body(vllm_client):
    assert post(vllm_client, "/generate_vllm", {"prompts": []}).json == {"generated_texts": []}
    r = post(vllm_client, "/generate_vllm", {"prompts": [1]})
    assert r.status_code == 422 and r.json["type"] == "invalid_request"


def test_greedy_parity_with_the_static_path(vllm_client):
    body = {"prompts": PROMPTS, "max_tokens": 12}
    static = post(vllm_client, "/generate", body).json["generated_texts"]
    continuous = post(vllm_client, "/generate_vllm", body).json["generated_texts"]
    assert static[0].startswith(" Paris") and continuous[0].startswith(" Paris")
    differing = [(p, s, c) for p, s, c in zip(PROMPTS, static, continuous, strict=True) if s != c]
    assert not differing, f"static and vLLM differ: {differing}"


def test_sixteen_concurrent_requests_each_get_their_own_text(vllm_app):
    prompts = [f"Fact number {i}: the number {i} plus one is" for i in range(16)]
    replies: dict[int, dict] = {}

    def ask(i):
        r = post(vllm_app.test_client(), "/generate_vllm", {"prompts": [prompts[i]], "max_tokens": 8})
        replies[i] = {"status": r.status_code, "text": r.json["generated_texts"][0]}

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(replies) == list(range(16)) and all(r["status"] == 200 for r in replies.values())
    together = post(vllm_app.test_client(), "/generate_vllm", {"prompts": prompts, "max_tokens": 8}).json
    assert [replies[i]["text"] for i in range(16)] == together["generated_texts"]
    assert len({r["text"] for r in replies.values()}) > 1


@pytest.fixture
def short_timeout_app(tmp_path):
    """An app of its own, both engines, with a REQUEST_TIMEOUT_S of 2 s (about 15 s to start here),
    and no machine profile: fresh, it prices nothing, so it admits what reaches it idle."""
    with own_app(request_timeout_s=2.0, profile_dir=str(tmp_path)) as app:
        yield app


def test_a_timed_out_request_is_aborted_in_the_engine(short_timeout_app, monkeypatch):
    app, client = short_timeout_app, short_timeout_app.test_client()
    engine, gate = app_state(app).engines["vllm"], threading.Event()
    real_step = engine.engine.step

    def held_step():  # the real step, once the test lets it go
        assert gate.wait(60)
        return real_step()

    monkeypatch.setattr(engine.engine, "step", held_step)
    # admitted (its engine is idle); no step can run before the 2 s deadline
    replies = []
    body = {"prompts": ["Tell me a long story about"] * 4, "max_tokens": 400}
    request = threading.Thread(target=lambda: replies.append(post(app.test_client(), "/generate_vllm", body)))
    request.start()
    wait_until(lambda: engine.unfinished() == 4, 60, "the four prompts to be in the engine")
    request.join(60)
    assert replies[0].status_code == 504 and replies[0].json["type"] == "deadline_exceeded"
    gate.set()
    wait_until(lambda: engine.unfinished() == 0 and engine.inflight() == 0, 60, "the engine to abort")
    app_state(app).config = dataclasses.replace(app_state(app).config, request_timeout_s=120)  # its own app
    assert post(client, "/generate_vllm", {"prompts": ["Hi"], "max_tokens": 2}).status_code == 200


def test_vllm_metrics_count_steps_and_tokens(vllm_client):
    post(vllm_client, "/generate_vllm", {"prompts": ["Hi"], "max_tokens": 3})
    text = vllm_client.get("/metrics").text
    assert 'generated_tokens_total{engine="vllm"}' in text
    steps = [line for line in text.splitlines() if line.startswith("vllm_engine_steps_total")]
    assert steps and float(steps[0].split()[-1]) >= 3


def test_health_shows_the_vllm_engine_ready(vllm_client):
    body = vllm_client.get("/health").json
    assert body["engines"]["vllm"]["status"] == "ready"
    assert body["engines"]["vllm"]["load_seconds"] > 0 and body["engines"]["vllm"]["error"] is None
    assert body["status"] == "ok"  # the whole service is ready, not only this engine


def test_ignore_eos_generates_exactly_max_tokens_on_both_paths(vllm_client):
    body = {"prompts": ["Write one sentence about the sea."], "max_tokens": 20, "details": True}
    for path in ("/generate", "/generate_vllm"):
        natural = post(vllm_client, path, body).json["details"][0]
        forced = post(vllm_client, path, {**body, "ignore_eos": True}).json["details"][0]
        assert natural["finish_reason"] == "stop" and natural["tokens"] < 20, path
        assert forced["finish_reason"] == "length" and forced["tokens"] == 20, path


def test_an_abort_that_fails_is_logged_and_the_prompts_still_answered(vllm_app, vllm_client, monkeypatch, caplog):
    engine = app_state(vllm_app).engines["vllm"]
    real_abort = engine.engine.abort_request

    def broken_step():
        raise RuntimeError("injected step failure")

    def abort_then_raise(ids):  # aborts for real (nothing is left in vLLM), then fails
        real_abort(ids)
        raise RuntimeError("injected abort failure")

    monkeypatch.setattr(engine.engine, "step", broken_step)
    monkeypatch.setattr(engine.engine, "abort_request", abort_then_raise)
    with caplog.at_level(logging.ERROR, logger="batcher.vllm.worker"):
        r = post(vllm_client, "/generate_vllm", {"prompts": ["Hi"], "max_tokens": 2})
    assert r.status_code == 500 and "injected step failure" in r.json["error"]
    aborts = [rec for rec in caplog.records if "could not abort" in rec.getMessage()]
    assert aborts and "injected abort failure" in str(aborts[0].exc_info[1])
    assert engine.inflight() == 0 and engine.unfinished() == 0


def test_health_shows_each_engines_resolved_settings_and_the_same_counts(vllm_app, vllm_client):
    engines = vllm_client.get("/health").json["engines"]
    static, vllm = engines["static"]["settings"], engines["vllm"]["settings"]
    assert set(static) == {"device", "dtype", "compile", "reason"}
    assert set(vllm) == {"device", "dtype", "enforce_eager", "reason"}
    # the session's app sets DTYPE, and conftest's PINNED the eager knobs: no profile is read
    assert static["reason"] == vllm["reason"] == "set explicitly"
    assert "auto" not in [*static.values(), *vllm.values()]  # resolved, once, at create_app
    runner = app_state(vllm_app).engines["static"].runner
    assert (runner.device, str(runner.dtype), runner.compiles) == (
        static["device"],
        f"torch.{static['dtype']}",
        static["compile"],
    )
    assert vllm["enforce_eager"] is engines["vllm"]["eager"]
    for name in ("static", "vllm"):  # one name per count on both engines
        assert {"queued", "running", "inflight"} <= set(engines[name]), name


def test_the_profile_measures_the_vllm_config_the_service_runs(vllm_app):
    """The profile's child builds its candidates with `vllm.LLM` (usage context LLM_CLASS), the
    service its engine with `LLMEngine` (ENGINE_CONTEXT), both from `VLLMSettings.engine_args()`:
    their configs must hash alike (the child's old arguments gave 4,096 batched tokens a step
    against the service's 2,048, and another hash)."""
    from vllm import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    settings = dataclasses.replace(app_state(vllm_app).engines["vllm"].settings, enforce_eager=False)
    profile, service = (
        EngineArgs(**settings.engine_args()).create_engine_config(usage)
        for usage in (UsageContext.LLM_CLASS, UsageContext.ENGINE_CONTEXT)
    )
    assert profile.scheduler_config.max_num_batched_tokens == service.scheduler_config.max_num_batched_tokens
    assert profile.compute_hash() == service.compute_hash()


def test_the_kv_cache_is_the_size_asked_in_bytes_and_a_gpu_gets_none(vllm_app):
    """VLLM_KV_CACHE_GIB was whole GiB (vLLM's VLLM_CPU_KVCACHE_SPACE), so 1 GiB was the least;
    it is vLLM's kv_cache_memory_bytes now, fractions allowed (the default 0.5), which a GPU must
    not get: it would override VLLM_GPU_MEMORY_UTILIZATION."""
    engine = app_state(vllm_app).engines["vllm"]
    cache = engine.engine.vllm_config.cache_config
    assert cache.kv_cache_memory_bytes == engine.settings.kv_cache_bytes == int(engine.settings.kv_cache_gib * 2**30)
    quarter = dataclasses.replace(engine.settings, device="cpu", kv_cache_gib=0.25)
    assert quarter.engine_args()["kv_cache_memory_bytes"] == 2**28
    assert "kv_cache_memory_bytes" not in dataclasses.replace(quarter, device="cuda").engine_args()


def test_a_max_model_len_past_the_models_own_fails_the_start_naming_our_setting(model_path):
    """vLLM refuses a max_model_len longer than the model's (8192 here) in its own argument's name:
    the engine's error, which /health and the stopped service show, names VLLM_MAX_MODEL_LEN."""
    from batcher.vllm.worker import VLLMWorker
    from service.config import Config

    worker = VLLMWorker(Config(vllm_max_model_len=16384).vllm_engine(model_path))
    dead = threading.Event()
    worker.when_dead(lambda name, error: dead.set())
    worker.start()
    try:
        assert dead.wait(300) and worker.status == "failed"
        assert "VLLM_MAX_MODEL_LEN=16384 does not fit MODEL" in worker.error and "8192" in worker.error
    finally:
        worker.stop()
