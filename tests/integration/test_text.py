"""Text that cannot be encoded (a lone surrogate: valid JSON, no UTF-8 for it) is a 400 naming
its field, before anything is enqueued, on every route that takes a body, both engines, both
route families (service/http/body.py's `json_body`, which every route reads its body through)."""

import json

import pytest

from tests.helpers import MODEL
from tests.helpers.apps import enqueued

BAD = "\ud800"  # json.dumps sends it as the JSON text "\ud800"
HI = {"messages": [{"role": "user", "content": "Hi"}]}

DEMO = [  # (path, body, the field the message names)
    ("/generate", {"prompts": ["Hi", BAD]}, "prompts[1]"),
    ("/generate_vllm", {"prompts": [BAD]}, "prompts[0]"),
    ("/basic_generate", {"prompt": "Hi" + BAD}, "prompt"),
    ("/generate_stream", {"prompt": "Hi", "stop": [BAD]}, "stop[0]"),
    ("/generate_vllm_stream", {"prompt": BAD}, "prompt"),
    ("/generate", {"prompts": ["Hi"], "structured_outputs": {"regex": "[a-z]" + BAD}}, "structured_outputs.regex"),
    ("/generate_vllm", {"prompts": ["Hi"], BAD: 1}, "the field name '\\ud800'"),
]

OPENAI = [  # (path, body, OpenAI's param: the top-level field)
    ("/v1/completions", {"prompt": ["Hi", BAD]}, "prompt"),
    ("/static/v1/completions", {"prompt": "Hi", "stop": BAD}, "stop"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": BAD}]}, "messages"),
    ("/static/v1/chat/completions", {"messages": [{"role": "system", "content": "Be" + BAD}]}, "messages"),
    (
        "/static/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "Hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"enum": [BAD]}}},
        },
        "response_format",
    ),
    ("/v1/chat/completions", HI | {"grammar": "root ::= " + BAD}, "grammar"),
    ("/tokenize", {"messages": [{"role": "user", "content": BAD}]}, "messages"),  # vLLM's shape
    ("/static/tokenize", {"prompt": BAD}, "prompt"),
]


def post(client, path, body):
    return client.post(path, data=json.dumps(body), content_type="application/json")


@pytest.mark.parametrize(("path", "body", "field"), DEMO)
def test_demo_routes_answer_400_naming_the_field_that_is_not_text(vllm_app, path, body, field):
    before = enqueued(vllm_app)  # a refused request adds none, whatever earlier tests left running
    r = post(vllm_app.test_client(), path, {"max_tokens": 2, **body})
    assert r.status_code == 400, r.json
    assert r.json["type"] == "invalid_text" and f"{field}" in r.json["error"], r.json
    assert enqueued(vllm_app) == before  # nothing reached either engine


@pytest.mark.parametrize(("path", "body", "param"), OPENAI)
def test_openai_routes_answer_openais_400_with_the_param(vllm_app, path, body, param):
    before = enqueued(vllm_app)
    r = post(vllm_app.test_client(), path, {"model": MODEL, "max_tokens": 2, **body})
    assert r.status_code == 400, r.json
    error = r.json["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "invalid_text", param), error
    assert "not valid Unicode text" in error["message"]
    assert enqueued(vllm_app) == before
