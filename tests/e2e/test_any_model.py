"""Any model the service can serve, `make serve` can serve (issue 44, point 0): a small model of
another architecture (OPT, the write-up's own family), built here from a config with random
weights and SmolLM2's tokenizer stripped of its chat template, goes through `make serve` as a user
would run it: nginx and gunicorn serve it at once with the defaults, the profile is measured beside
(through plain completions, and says so), a second gunicorn takes over with its choices
(deploy/first_profile.py), and every route family answers one request: the completions routes of
both engines 200, the chat and Responses routes a clear 400. And a GGUF file (MODEL=<path>.gguf):
a tiny llama written with gguf-py, served by gunicorn on both engines."""

import json

import pytest
import requests

from tests.helpers.make_serve import MakeServe
from tests.helpers.servers import serving

NO_TEMPLATE = "this model has no chat template"


@pytest.fixture(scope="module")
def opt_folder(tmp_path_factory):
    """A tiny OPTForCausalLM (random weights, seeded) with SmolLM2's tokenizer, no chat template."""
    import torch
    from transformers import AutoTokenizer, OPTConfig, OPTForCausalLM

    from batcher.checkpoint import DEFAULT_CACHE_DIR, DEFAULT_MODEL, resolve_model

    folder = tmp_path_factory.mktemp("models") / "tiny-opt"
    tok = AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL, DEFAULT_CACHE_DIR))
    tok.chat_template = None
    config = OPTConfig(
        vocab_size=len(tok),
        hidden_size=64,
        word_embed_proj_dim=64,
        ffn_dim=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=2048,  # VLLM_MAX_MODEL_LEN's default
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    OPTForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    assert AutoTokenizer.from_pretrained(folder).chat_template is None  # what this test is about
    return folder


@pytest.fixture(scope="module")
def served_opt(opt_folder, tmp_path_factory):
    profiles = tmp_path_factory.mktemp("profiles")  # its profile apart from the default model's
    # a short budget: the reference row is what this test reads, and it runs whatever the budget
    # (batcher/profile/measure.py); the rest of a full profile is minutes of a tiny model's compiles
    env = {"MODEL": str(opt_folder), "PROFILE_DIR": str(profiles), "PROFILE_BUDGET": "30"}
    srv = MakeServe(tmp_path_factory.mktemp("serve-opt"), env)
    try:
        srv.wait_ready(900)  # at once, with the defaults: the model has no profile yet
        srv.wait_switched(1200)  # then on the profile's choices, measured beside it
        yield srv, profiles
    finally:
        srv.stop()


def test_make_serve_profiles_it_through_plain_completions_and_says_so(served_opt):
    srv, profiles = served_opt
    log = srv.log_text()
    assert "plain completions (the model has no chat template)" in log, log[-3000:]
    (profile,) = [json.loads(p.read_text()) for p in profiles.glob("*.json")]
    assert profile["prompts"] == "completion"
    reference = profile["rows"][0]
    assert reference["status"] == "measured" and reference["exact"] == reference["of"] == 20, reference
    # random weights never say Paris: no France bar, and the choice says so rather than "France right"
    assert reference["france_bar"] is False and "France n/a" in log


def test_every_route_family_answers(served_opt, opt_folder):
    srv, _ = served_opt
    url, model = srv.url, opt_folder.name
    text = {"max_tokens": 4, "ignore_eos": True}
    for path in ("/generate", "/generate_vllm"):
        r = requests.post(f"{url}{path}", json={"prompts": ["Hello there"], **text}, timeout=120)
        assert r.status_code == 200, (path, r.text)
        assert len(r.json()["generated_texts"]) == 1
    for prefix in ("/v1", "/static/v1"):
        r = requests.post(f"{url}{prefix}/completions", json={"model": model, "prompt": "Hello", **text}, timeout=120)
        assert r.status_code == 200, (prefix, r.text)
        assert r.json()["usage"]["completion_tokens"] == 4
        chat = {"model": model, "messages": [{"role": "user", "content": "Hi"}], **text}
        r = requests.post(f"{url}{prefix}/chat/completions", json=chat, timeout=120)
        assert r.status_code == 400 and NO_TEMPLATE in r.json()["error"]["message"], (prefix, r.text)
        r = requests.post(f"{url}{prefix}/responses", json={"model": model, "input": "Hi", "max_output_tokens": 4})
        assert r.status_code == 400 and NO_TEMPLATE in r.json()["error"]["message"], (prefix, r.text)
        r = requests.get(f"{url}{prefix}/models", timeout=30)
        assert r.status_code == 200 and r.json()["data"][0]["id"] == model
    r = requests.post(f"{url}/tokenize", json={"model": model, "prompt": "Hello"}, timeout=30)
    assert r.status_code == 200 and r.json()["count"] >= 1, r.text


def test_a_gguf_file_serves_on_both_engines(tmp_path):
    """MODEL=<a GGUF file>: converted once into CACHE_DIR, both engines reading the file's own
    blocks (STATIC_WEIGHTS and VLLM_WEIGHTS blocks); both answer, under the file's name."""
    from batcher.checkpoint import gguf_path
    from tests.helpers.tiny_gguf import write

    model = write(tmp_path / "tiny.gguf", gguf_path())
    env = {"MODEL": str(model), "CACHE_DIR": str(tmp_path / "models"), "STATIC_WEIGHTS": "blocks"}
    with serving(tmp_path, {**env, "VLLM_WEIGHTS": "blocks"}) as srv:
        engines = srv.health()["engines"]
        assert engines["static"]["settings"]["dtype"] == "blocks", engines["static"]
        assert engines["vllm"]["settings"]["dtype"] == "blocks", engines["vllm"]
        body = {"prompts": ["Hello there", "The sky is"], "max_tokens": 4, "ignore_eos": True}
        for path in ("/generate", "/generate_vllm"):
            r = requests.post(f"{srv.url}{path}", json=body, timeout=120)
            assert r.status_code == 200 and len(r.json()["generated_texts"]) == 2, (path, r.text)
        for prefix in ("/v1", "/static/v1"):
            chat = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
            r = requests.post(f"{srv.url}{prefix}/chat/completions", json=chat, timeout=120)
            assert r.status_code == 200 and r.json()["model"] == "tiny", (prefix, r.text)
