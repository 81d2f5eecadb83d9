"""/tokenize and /detokenize on both engines (vLLM's shapes), through the real app and engines:
what they answer is the tokenizer's own output, and the chat template's for messages."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from service import create_app
from service.config import Config

PREFIXES = pytest.mark.parametrize("prefix", ["", "/static"])
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another?"},
]
TEXT = "The capital of France is Paris. Ünïcödé, emoji 🙂 and  two spaces."


@pytest.fixture(scope="module")
def tokenizer(model_path):
    return AutoTokenizer.from_pretrained(model_path)


def post(client, path: str, body, **kw):
    return client.post(path, json=body, **kw)


@PREFIXES
def test_a_prompt_is_the_tokenizers_ids_and_they_detokenize_back(vllm_client, tokenizer, prefix):
    r = post(vllm_client, f"{prefix}/tokenize", {"prompt": TEXT})
    assert r.status_code == 200, r.json
    expected = tokenizer(TEXT).input_ids
    models = vllm_client.get(f"{prefix}/v1/models").json["data"][0]
    shape = {"count": len(expected), "max_model_len": models["max_model_len"], "tokens": expected}
    assert r.json == {**shape, "token_strs": None}
    back = post(vllm_client, f"{prefix}/detokenize", {"tokens": expected})
    assert back.status_code == 200 and back.json == {"prompt": tokenizer.decode(expected)}
    assert back.json["prompt"] == TEXT


@PREFIXES
def test_token_strs_and_add_special_tokens_are_honoured(vllm_client, tokenizer, prefix):
    body = {"prompt": TEXT, "return_token_strs": True, "add_special_tokens": False}
    r = post(vllm_client, f"{prefix}/tokenize", body)
    ids = tokenizer(TEXT, add_special_tokens=False).input_ids
    assert r.status_code == 200 and r.json["tokens"] == ids
    assert r.json["token_strs"] == tokenizer.convert_ids_to_tokens(ids)


@PREFIXES
@pytest.mark.parametrize("add_generation_prompt", [True, False, None])
def test_messages_are_the_chat_template_the_chat_route_renders(vllm_client, tokenizer, prefix, add_generation_prompt):
    body = {"messages": MESSAGES, "model": "SmolLM2-135M-Instruct"}
    if add_generation_prompt is not None:
        body["add_generation_prompt"] = add_generation_prompt
    r = post(vllm_client, f"{prefix}/tokenize", body)
    assert r.status_code == 200, r.json
    generation_prompt = add_generation_prompt is not False  # vLLM's default: true
    expected = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=generation_prompt, return_dict=False)
    assert r.json["tokens"] == expected and r.json["count"] == len(expected)
    rendered = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=generation_prompt)
    assert post(vllm_client, f"{prefix}/detokenize", {"tokens": expected}).json["prompt"] == rendered


@PREFIXES
@pytest.mark.parametrize(
    "path, body, param",
    [
        ("tokenize", {}, "prompt"),
        ("tokenize", {"prompt": ""}, "prompt"),
        ("tokenize", {"prompt": ["a", "b"]}, "prompt"),
        ("tokenize", {"prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens"),
        ("tokenize", {"prompt": "a", "return_token_strs": 1}, "return_token_strs"),
        ("tokenize", {"prompt": "a", "model": "gpt-4"}, "model"),
        ("tokenize", {"messages": []}, "messages"),
        ("tokenize", {"messages": [{"content": "hi"}]}, "messages"),
        ("tokenize", {"messages": MESSAGES, "add_generation_prompt": "no"}, "add_generation_prompt"),
        ("tokenize", {"messages": MESSAGES, "continue_final_message": True}, "continue_final_message"),
        ("tokenize", {"messages": MESSAGES, "chat_template": "{{ messages }}"}, "chat_template"),
        ("tokenize", {"messages": MESSAGES, "chat_template_kwargs": {"a": 1}}, "chat_template_kwargs"),
        ("tokenize", {"messages": MESSAGES, "tools": [{"type": "function"}]}, "tools"),
        ("detokenize", {}, "tokens"),
        ("detokenize", {"tokens": []}, "tokens"),
        ("detokenize", {"tokens": "1 2 3"}, "tokens"),
        ("detokenize", {"tokens": [1, "2"]}, "tokens"),
        ("detokenize", {"tokens": [1, True]}, "tokens"),
        ("detokenize", {"tokens": [1, 2.5]}, "tokens"),
        ("detokenize", {"tokens": [-1]}, "tokens"),
        ("detokenize", {"tokens": [49152]}, "tokens"),
        ("detokenize", {"tokens": [1], "model": "gpt-4"}, "model"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(vllm_client, prefix, path, body, param):
    r = post(vllm_client, f"{prefix}/{path}", body)
    assert r.status_code in (400, 404) and r.json["error"]["param"] == param, r.json
    assert r.status_code == (404 if param == "model" else 400)


@PREFIXES
def test_a_body_that_is_not_json_is_a_400(vllm_client, prefix):
    r = vllm_client.post(f"{prefix}/tokenize", data="{not json", content_type="application/json")
    assert r.status_code == 400 and r.json["error"]["code"] == "invalid_json"


def test_the_largest_id_of_the_vocabulary_detokenizes(vllm_client, tokenizer):
    top = len(tokenizer) - 1
    for prefix in ("", "/static"):
        r = post(vllm_client, f"{prefix}/detokenize", {"tokens": [top]})
        assert r.status_code == 200 and r.json["prompt"] == tokenizer.decode([top])


def test_an_engine_that_is_not_ready_answers_503_as_the_openai_routes_do():
    app = create_app(Config(vllm_enabled=False), start=False)  # no thread started: static is loading
    client = app.test_client()
    for prefix, state in (("", "disabled"), ("/static", "loading")):
        for path, body in (("tokenize", {"prompt": "hi"}), ("detokenize", {"tokens": [1]})):
            r = post(client, f"{prefix}/{path}", body)
            openai = post(client, f"{prefix}/v1/completions", {"prompt": "hi"})
            assert r.status_code == openai.status_code == 503
            assert r.json["error"]["code"] == openai.json["error"]["code"]
            assert state in r.json["error"]["message"]
