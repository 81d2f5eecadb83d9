"""The context-length rule (service/context_length.py) on both engines and both route families, through
the real app: an over-long prompt is a 400 naming both counts, never cut silently;
`truncate_prompt_tokens` keeps its last k tokens when asked; a chat prompt keeps its head."""

import json

import pytest

from service import context_length
from service.http.state import app_state
from service.openai.chat import template as chat
from service.plan import Served
from tests.helpers import MODEL
from tests.helpers.apps import enqueued

LONG = " ".join(["word"] * 700)  # some 700 tokens: more than MAX_INPUT_TOKENS (512)
ENGINES = pytest.mark.parametrize("base", ["/v1", "/static/v1"])
DEMO = pytest.mark.parametrize("path", ["/generate", "/generate_vllm"])


def post(client, path, body):
    return client.post(path, data=json.dumps(body), content_type="application/json")


def tokens(app, text: str) -> list[int]:
    return app_state(app).tokenizer(text)["input_ids"]


@ENGINES
def test_an_over_long_prompt_is_openais_400_naming_both_counts(vllm_app, base):
    count = len(tokens(vllm_app, LONG))
    client, before = vllm_app.test_client(), enqueued(vllm_app)
    for route, body in (
        ("completions", {"prompt": LONG}),
        ("chat/completions", {"messages": [{"role": "user", "content": LONG}]}),
    ):
        r = post(client, f"{base}/{route}", {"model": MODEL, "max_tokens": 3, **body})
        assert r.status_code == 400, r.json
        error = r.json["error"]
        assert error["code"] == "context_length_exceeded" and error["type"] == "invalid_request_error"
        assert error["param"] == ("prompt" if route == "completions" else "messages")
        assert "at most 512" in error["message"] and "input tokens" in error["message"]
        if route == "completions":
            assert f"contains {count} input tokens" in error["message"], error
    assert enqueued(vllm_app) == before  # nothing reached an engine


@DEMO
def test_an_over_long_prompt_is_a_400_on_the_demo_routes(vllm_app, path):
    before = enqueued(vllm_app)
    r = post(vllm_app.test_client(), path, {"prompts": ["Hi", LONG], "max_tokens": 3})
    assert r.status_code == 400 and r.json["type"] == "context_length_exceeded", r.json
    assert f"contains {len(tokens(vllm_app, LONG))} input tokens" in r.json["error"]
    assert enqueued(vllm_app) == before  # not even "Hi", the prompt before it


@ENGINES
def test_truncate_prompt_tokens_keeps_the_last_k_tokens(vllm_app, base):
    client, ids = vllm_app.test_client(), tokens(vllm_app, LONG + " The capital of France is")
    body = {"model": MODEL, "max_tokens": 4, "temperature": 0}
    cut = post(
        client,
        f"{base}/completions",
        {**body, "prompt": LONG + " The capital of France is", "truncate_prompt_tokens": 40},
    )
    assert cut.status_code == 200, cut.json
    assert cut.json["usage"]["prompt_tokens"] == 40
    kept = post(client, f"{base}/completions", {**body, "prompt": ids[-40:]}).json  # the same 40 ids, sent as ids
    assert cut.json["choices"][0]["text"] == kept["choices"][0]["text"]
    whole = post(client, f"{base}/completions", {**body, "prompt": LONG, "truncate_prompt_tokens": -1})
    assert whole.status_code == 200 and whole.json["usage"]["prompt_tokens"] == 512  # -1: MAX_INPUT_TOKENS


@DEMO
def test_truncate_prompt_tokens_on_the_demo_routes(vllm_app, path):
    client, ids = vllm_app.test_client(), tokens(vllm_app, LONG + " The capital of France is")
    body = {"max_tokens": 4, "truncate_prompt_tokens": 40}
    cut = post(client, path, {**body, "prompts": [LONG + " The capital of France is"]})
    kept = post(
        client,
        "/v1/completions" if path.endswith("vllm") else "/static/v1/completions",
        {"model": MODEL, "prompt": ids[-40:], "max_tokens": 4, "temperature": 0},
    )
    assert cut.status_code == 200, cut.json
    assert cut.json["generated_texts"] == [kept.json["choices"][0]["text"]]


@pytest.mark.parametrize(("value", "why"), [(0, "-1 or an integer >= 1"), (513, "cannot be greater"), ("9", "integer")])
def test_a_bad_truncate_prompt_tokens_is_a_400_naming_it(vllm_client, value, why):
    r = post(vllm_client, "/v1/completions", {"model": MODEL, "prompt": "Hi", "truncate_prompt_tokens": value})
    assert r.status_code == 400 and r.json["error"]["param"] == "truncate_prompt_tokens", r.json
    assert why in r.json["error"]["message"]
    r = post(vllm_client, "/generate", {"prompts": ["Hi"], "truncate_prompt_tokens": value})
    assert r.status_code == 422 and why in r.json["error"], r.json


def test_a_cut_chat_prompt_keeps_its_templates_head(vllm_app):
    messages = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": LONG + " Hi?"}]
    config, tokenizer = app_state(vllm_app).config, app_state(vllm_app).tokenizer
    served = Served(config, tokenizer)  # what a view hands down: no request context needed
    rendered, head = chat.render(served, messages), chat.fixed_prefix(served, messages)
    [ids] = context_length.fit(
        [rendered], truncate=60, max_tokens=3, param="messages", tokenizer=tokenizer, config=config, prefixes=[head]
    )
    head_ids, full = tokens(vllm_app, head), tokens(vllm_app, rendered)
    assert head.endswith("<|im_start|>user\n") and "You answer briefly." in head
    assert len(ids) == 60 and list(ids[: len(head_ids)]) == head_ids  # the head whole
    assert list(ids[len(head_ids) :]) == full[-(60 - len(head_ids)) :]  # then the end of the prompt


@ENGINES
def test_a_chat_cut_that_would_reach_into_the_head_is_a_400(vllm_app, base):
    client = vllm_app.test_client()
    body = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": LONG}]}
    r = post(client, f"{base}/chat/completions", {**body, "truncate_prompt_tokens": 5})
    assert r.status_code == 400 and r.json["error"]["param"] == "truncate_prompt_tokens", r.json
    assert "head" in r.json["error"]["message"]
    ok = post(client, f"{base}/chat/completions", {**body, "truncate_prompt_tokens": 100})
    assert ok.status_code == 200 and ok.json["usage"]["prompt_tokens"] == 100, ok.json


def test_prompt_plus_max_tokens_over_the_models_length_names_both():
    # unreachable through the default settings (max_model_len is MAX_INPUT_TOKENS plus the largest
    # max_tokens), so the rule itself, with a window where the two can meet
    with pytest.raises(
        context_length.ContextTooLong, match=r"requested 130 tokens \(100 in the prompt, 30 in the completion\)"
    ):
        context_length._check(100, 30, max_input=120, max_model_len=128, param="prompt")
    context_length._check(100, 28, max_input=120, max_model_len=128, param="prompt")
