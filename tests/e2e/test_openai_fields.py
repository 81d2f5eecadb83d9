"""What the OpenAI routes do with each request field (service/openai/fields.py), request ids and
hostile bodies, on both engines, through the real `openai` SDK against the real gunicorn.

Every refused field is a 400 `invalid_request_error` naming it in `param` and leaves nothing in
either engine; the fields that change nothing are answered 200 with the same text as without them.
"""

from __future__ import annotations

import re

import openai
import pytest
import requests

from service.openai import fields as openai_fields
from tests.helpers import BASES, MODEL, PARIS
from tests.helpers.servers import auth, json_auth, nothing_held

# its fixtures, on the session's shared gunicorn (tests/e2e/conftest.py: both engines, API_KEY set)


@pytest.fixture(scope="module")
def server(shared_server):
    return shared_server  # tests/e2e/conftest.py: the session's gunicorn, API_KEY set


MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]

# (route, field, a value the service does not implement)
REFUSED = [
    ("completions", "suffix", "and so on"),
    ("completions", "best_of", 2),
    ("completions", "best_of", True),  # JSON true is not 1
    ("completions", "use_beam_search", True),
    ("completions", "guided_json", {"type": "object"}),
    ("completions", "guided_regex", "[0-9]+"),
    ("completions", "guided_choice", ["yes", "no"]),
    ("completions", "include_stop_str_in_output", True),
    ("completions", "skip_special_tokens", False),
    ("completions", "truncation_side", "right"),  # truncate_prompt_tokens keeps the last tokens
    ("completions", "allowed_token_ids", [1, 2]),
    ("completions", "bad_words", ["Paris"]),
    ("completions", "priority", 5),
    ("completions", "return_token_ids", True),
    ("completions", "max_completion_tokens", 3),  # a chat field: silently ignoring it would be a lie
    ("completions", "logit_bias", {"-1": 1}),
    ("completions", "logit_bias", {"5": 101}),
    ("completions", "logit_bias", {"99999999": 1}),  # outside the vocabulary
    ("completions", "tools", [{"type": "function", "function": {"name": "f"}}]),
    ("chat", "functions", [{"name": "f"}]),
    ("chat", "function_call", "auto"),
    ("chat", "audio", {"voice": "alloy", "format": "wav"}),
    ("chat", "modalities", ["text", "audio"]),
    ("chat", "prediction", {"type": "content", "content": "Paris"}),
    ("chat", "reasoning_effort", "low"),
    ("chat", "web_search_options", {}),
    ("chat", "verbosity", "low"),
    ("chat", "chat_template", "{{ messages }}"),
    ("chat", "chat_template_kwargs", {"enable_thinking": True}),
    ("chat", "continue_final_message", True),
    ("chat", "add_generation_prompt", False),
    ("chat", "guided_grammar", "root ::= 'a'"),
]

# fields that change no token of the output, and a field nobody defined (vLLM ignores those too)
NO_OPS = {
    "user": "u-1",
    "metadata": {"run": "eval"},
    "store": False,
    "service_tier": "auto",
    "safety_identifier": "s-1",
    "prompt_cache_key": "k",
    "request_id": "body-id",
    "cache_salt": "salt",
    "best_of": 1,
    "echo": False,
    "priority": 0,
    "use_beam_search": False,
    "skip_special_tokens": True,
    "truncate_prompt_tokens": -1,  # a short prompt: nothing to cut
    "a_field_nobody_defined": {"x": 1},
}
CHAT_NO_OPS = {**NO_OPS, "tool_choice": "none", "modalities": ["text"], "include_reasoning": True}


def create(sdk: openai.OpenAI, route: str, **fields):
    if route == "chat":
        return sdk.chat.completions.create(model=MODEL, messages=MESSAGES, **fields)
    return sdk.completions.create(model=MODEL, prompt=PARIS, **fields)


def test_every_refused_field_here_is_in_the_table_as_refused():
    for route, field, value in REFUSED:
        rule = openai_fields.ROUTES[route].get(field)
        assert field == "logit_bias" or (rule is not None and not rule.accepts(value)), (route, field)


@BASES
@pytest.mark.parametrize(("route", "field", "value"), REFUSED, ids=[f"{r}-{f}-{v!r}"[:60] for r, f, v in REFUSED])
def test_a_field_we_do_not_implement_is_a_400_naming_it(server, sdk, route, field, value):
    with pytest.raises(openai.BadRequestError) as refused:
        create(sdk, route, max_tokens=2, extra_body={field: value})
    assert refused.value.body["param"] == field, refused.value.body
    assert refused.value.body["type"] == "invalid_request_error"
    nothing_held(server)


@BASES
@pytest.mark.parametrize("route", ["completions", "chat"])
def test_fields_that_change_nothing_are_accepted_and_change_nothing(sdk, route):
    extra = CHAT_NO_OPS if route == "chat" else NO_OPS
    plain = create(sdk, route, max_tokens=6, temperature=0)
    with_them = create(sdk, route, max_tokens=6, temperature=0, extra_body=extra)
    text = (lambda r: r.choices[0].message.content) if route == "chat" else (lambda r: r.choices[0].text)
    assert text(with_them) == text(plain) and text(plain)
    assert with_them.usage == plain.usage


@BASES
def test_max_completion_tokens_wins_over_max_tokens_on_chat(sdk):
    reply = sdk.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_completion_tokens=3, max_tokens=9, extra_body={"ignore_eos": True}
    )
    assert reply.usage.completion_tokens == 3 and reply.choices[0].finish_reason == "length"
    only_old = sdk.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, extra_body={"ignore_eos": True}
    )
    assert only_old.usage.completion_tokens == 4
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=0, max_tokens=9)
    assert bad.value.body["param"] == "max_completion_tokens"


@BASES
def test_continuous_usage_stats_put_usage_in_every_chunk(sdk, streaming_sdk):
    options = {"include_usage": True, "continuous_usage_stats": True}
    asked = {"max_tokens": 5, "temperature": 0, "extra_body": {"ignore_eos": True}}
    for route in ("chat", "completions"):
        plain = create(sdk, route, **asked)
        *chunks, last = create(streaming_sdk, route, stream=True, stream_options=options, **asked)
        assert last.choices == [] and last.usage.completion_tokens == 5
        assert all(c.usage is not None for c in chunks), route
        assert all(c.usage.prompt_tokens == plain.usage.prompt_tokens for c in chunks), route
        counts = [c.usage.completion_tokens for c in chunks]
        assert counts == sorted(counts) and counts[-1] == 5, (route, counts)
        assert all(c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens for c in chunks)
        if route == "chat":  # the opening chunk, the role's: nothing generated yet
            assert chunks[0].choices[0].delta.role == "assistant" and counts[0] == 0
    # per choice, as vLLM counts: each prompt's own tokens and each completion's own so far
    prompts = [PARIS, "Once upon a time, in a land far away"]
    *chunks, last = streaming_sdk.completions.create(
        model=MODEL, prompt=prompts, stream=True, stream_options=options, **asked
    )
    per_prompt = {c.choices[0].index: c.usage.prompt_tokens for c in chunks}
    assert sum(per_prompt.values()) == last.usage.prompt_tokens and per_prompt[0] != per_prompt[1]
    with pytest.raises(openai.BadRequestError) as bad:  # vLLM would silently send no usage at all
        list(create(streaming_sdk, "chat", stream=True, stream_options={"continuous_usage_stats": True}, **asked))
    assert bad.value.body["param"] == "stream_options"


UNKNOWN_PATHS = [("POST", "/embeddings"), ("GET", "/no/such/thing"), ("GET", "/v2"), ("POST", ""), ("GET", "/")]


@BASES
@pytest.mark.parametrize(("method", "path"), UNKNOWN_PATHS)
def test_an_unknown_path_is_a_404_in_openais_shape(server, base, method, path):
    r = requests.request(method, f"{server.url}{base}{path}", headers=auth(), json={}, timeout=30)
    assert r.status_code == 404
    assert r.json() == {
        "error": {
            "message": f"Invalid URL ({method} {base}{path})",
            "type": "not_found_error",
            "param": None,
            "code": "not_found",
        }
    }


@BASES
def test_the_request_id_is_echoed_and_logged(server, sdk, base):
    mark = server.log_mark()  # the server is shared: what this test's requests logged
    raw = sdk.completions.with_raw_response.create(
        model=MODEL, prompt=PARIS, max_tokens=1, extra_headers={"X-Request-Id": f"eval-{base}-42"}
    )
    assert raw.headers["X-Request-Id"] == f"eval-{base}-42" and raw.parse().id.startswith("cmpl-")  # its own id
    assert f"POST {base}/completions 200" in server.log_text(since=mark)
    assert re.search(
        rf"POST {base}/completions 200 \S+ request_id=eval-{re.escape(base)}-42\n", server.log_text(since=mark)
    )
    with pytest.raises(openai.BadRequestError) as refused:  # an error's reply has it too
        sdk.completions.create(model=MODEL, prompt=PARIS, suffix="x", extra_headers={"X-Request-Id": "eval-400"})
    assert refused.value.response.headers["X-Request-Id"] == "eval-400"
    assert "request_id=eval-400\n" in server.log_text(since=mark)
    made = sdk.completions.with_raw_response.create(model=MODEL, prompt=PARIS, max_tokens=1)
    assert re.fullmatch(r"[0-9a-f]{32}", made.headers["X-Request-Id"])
    for hostile in ("x" * 129, "two words", "é"):  # too long, not printable ASCII: a new one instead
        r = requests.get(f"{server.url}/health", headers={"X-Request-Id": hostile.encode()}, timeout=30)
        assert re.fullmatch(r"[0-9a-f]{32}", r.headers["X-Request-Id"]), hostile
    assert (
        requests.get(f"{server.url}/health", headers={"X-Request-Id": "h-1"}, timeout=30).headers["X-Request-Id"]
        == "h-1"
    )


@BASES
def test_a_body_nested_5000_deep_is_a_400_like_bad_json_and_the_engines_keep_running(server, sdk, base):
    deep, mark = "[" * 5000 + "]" * 5000, server.log_mark()
    for body in (deep, '{"prompt": "Hi", "stop": ' + deep + "}"):
        r = requests.post(f"{server.url}{base}/completions", data=body, headers=json_auth(), timeout=30)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "invalid_json", error
    demo = requests.post(f"{server.url}/generate", data=deep, headers=json_auth(), timeout=30)
    assert demo.status_code == 400 and demo.json()["type"] == "invalid_json"
    nothing_held(server)
    assert sdk.completions.create(model=MODEL, prompt=PARIS, max_tokens=2, temperature=0).choices[0].text
    assert "Traceback" not in server.log_text(since=mark)


@BASES
def test_details_with_stream_is_a_400_naming_it_not_a_silent_drop(sdk):
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.completions.create(model=MODEL, prompt="Hi", max_tokens=2, stream=True, extra_body={"details": True})
    assert bad.value.body["param"] == "details"
