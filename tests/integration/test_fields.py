"""Unknown fields on the demo routes (our own API: nothing there is unknown) are a 400 naming them,
with the nearest known name; the OpenAI routes keep vLLM's rule (a name nobody defined is ignored),
tests/e2e/test_openai_fields.py. On both engines, through the real app."""

import json

import pytest

from service.demo.protocol import Generate
from service.protocol import names
from tests.helpers import MODEL
from tests.helpers.apps import enqueued

ROUTES = pytest.mark.parametrize(
    ("path", "prompt"),
    [
        ("/generate", {"prompts": ["Hi"]}),
        ("/generate_vllm", {"prompts": ["Hi"]}),
        ("/basic_generate", {"prompt": "Hi"}),
        ("/generate_stream", {"prompt": "Hi"}),
        ("/generate_vllm_stream", {"prompt": "Hi"}),
    ],
)


def post(client, path, body):
    return client.post(path, data=json.dumps(body), content_type="application/json")


@ROUTES
def test_a_misspelt_field_is_a_400_suggesting_the_right_name(vllm_app, path, prompt):
    client, before = vllm_app.test_client(), enqueued(vllm_app)
    for typo, meant in (("max_new_tokens", "max_tokens"), ("temprature", "temperature")):
        r = post(client, path, {**prompt, typo: 3})
        assert r.status_code == 400 and r.json["type"] == "unknown_field", r.json
        assert f"'{typo}' (did you mean '{meant}'?)" in r.json["error"]
    assert enqueued(vllm_app) == before  # nothing reached an engine


def test_every_unknown_field_is_named_and_one_without_a_near_name_gets_no_suggestion(vllm_client):
    r = post(vllm_client, "/generate", {"prompts": ["Hi"], "max_new_tokens": 3, "zzz": 1})
    assert r.status_code == 400
    assert "unknown fields 'max_new_tokens' (did you mean 'max_tokens'?), 'zzz'; this route takes" in r.json["error"]
    r = post(vllm_client, "/generate", {"prompt": "Hi"})  # /basic_generate's key on /generate
    assert r.status_code == 400 and "'prompt' (did you mean 'prompts'?)" in r.json["error"]


@ROUTES
def test_every_documented_field_is_known(vllm_client, path, prompt):
    body = {**prompt, "max_tokens": 2, "temperature": 0, "top_p": 1, "top_k": -1, "min_p": 0, "stop": ["zz"]}
    body |= {"stop_token_ids": [], "min_tokens": 0, "seed": 1, "presence_penalty": 0, "frequency_penalty": 0}
    body |= {"repetition_penalty": 1, "logit_bias": {}, "ignore_eos": False, "response_format": {"type": "text"}}
    body |= {"max_queue_ms": 60000, "truncate_prompt_tokens": -1, "details": False}
    assert set(body) - set(prompt) <= set(names(Generate))
    r = post(vllm_client, path, body)
    assert r.status_code == 200, r.get_data(as_text=True)


def test_the_openai_routes_still_ignore_a_name_nobody_defined(vllm_client):
    for base in ("/v1", "/static/v1"):
        body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "max_new_tokens": 3}
        assert post(vllm_client, f"{base}/completions", body).status_code == 200
