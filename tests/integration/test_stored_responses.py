"""Stored responses (service/openai/responses/stored.py) through the `openai` SDK, unmodified and
validating strictly, on apps in this process (httpx's WSGI transport) on both base URLs: a
conversation by `previous_response_id` whose function call and its output reach the last turn's
prompt, retrieve, input_items, delete, cancel; each key's own; the context bound; a batch line's."""

from __future__ import annotations

import httpx
import openai
import pytest

from service.jobs.runner import BATCH_LINE
from tests.helpers import BASES, MODEL
from tests.helpers.apps import post, static_app

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
GREEDY = {"model": MODEL, "temperature": 0, "max_output_tokens": 24}


def sdk_in_process(app, base: str, key: str = "-") -> openai.OpenAI:
    transport = httpx.WSGITransport(app=app)
    client = httpx.Client(transport=transport)
    return openai.OpenAI(
        base_url=f"http://service{base}", api_key=key, max_retries=0, http_client=client,
        _strict_response_validation=True,
    )  # fmt: skip


@pytest.fixture
def sdk(vllm_app, base) -> openai.OpenAI:
    return sdk_in_process(vllm_app, base)


@BASES
def test_the_sdk_runs_a_conversation_whose_call_and_its_output_reach_the_last_turn(sdk, vllm_app, base):
    question = "What is the weather in Paris?"
    asked = sdk.responses.create(**GREEDY, input=question, tools=[WEATHER], tool_choice="required")
    [call] = asked.output
    assert call.type == "function_call" and call.name == "get_weather", asked
    output = {"type": "function_call_output", "call_id": call.call_id, "output": '{"celsius": 31}'}
    answered = sdk.responses.create(**GREEDY, input=[output], previous_response_id=asked.id, tools=[WEATHER])
    assert answered.previous_response_id == asked.id and answered.store is True
    thanked = sdk.responses.create(**GREEDY, input="Thanks!", previous_response_id=answered.id)

    items = sdk.responses.input_items.list(thanked.id, order="asc").data
    kinds = [(item.type, getattr(item, "role", None)) for item in items]
    assert kinds == [
        ("message", "user"), ("function_call", None), ("function_call_output", None),
        ("message", "assistant"), ("message", "user"),
    ]  # fmt: skip
    assert items[1].call_id == items[2].call_id == call.call_id and items[2].output == '{"celsius": 31}'
    # the last turn's prompt is the whole conversation, as chat renders it (no instructions, no tools)
    messages = [
        {"role": "user", "content": question},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
        ]},
        {"role": "tool", "tool_call_id": call.call_id, "content": '{"celsius": 31}'},
        {"role": "assistant", "content": answered.output_text},
        {"role": "user", "content": "Thanks!"},
    ]  # fmt: skip
    counted = post(vllm_app.test_client(), "/tokenize", {"model": MODEL, "messages": messages})
    assert thanked.usage.input_tokens == counted.json["count"], counted.json

    assert sdk.responses.retrieve(answered.id).model_dump() == answered.model_dump()
    newest_first = sdk.responses.input_items.list(thanked.id, limit=2, include=["message.input_image.image_url"])
    assert [item.id for item in newest_first.data] == [items[4].id, items[3].id] and newest_first.has_more
    with pytest.raises(openai.BadRequestError) as cancel:
        sdk.responses.cancel(asked.id)
    assert "background" in cancel.value.message
    sdk.responses.delete(thanked.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(thanked.id)
    assert sdk.responses.retrieve(asked.id).id == asked.id  # the turns before it stay


@BASES
def test_a_streamed_response_is_stored_before_its_last_event(vllm_app, base):
    streaming = sdk_in_process(vllm_app, base)
    streaming._strict_response_validation = False  # stream chunks: see tests/e2e/conftest.py streaming_sdk
    with streaming.responses.stream(**GREEDY, input="Say hello.") as stream:
        *_, last = stream  # response.completed, or response.incomplete where 24 tokens cut it
    final = last.response
    assert last.type in ("response.completed", "response.incomplete") and final.status != "in_progress"
    assert sdk_in_process(vllm_app, base).responses.retrieve(final.id).model_dump() == final.model_dump()


@BASES
def test_store_false_keeps_nothing(sdk, base):
    reply = sdk.responses.create(**GREEDY, input="Say hello.", store=False)
    assert reply.store is False
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(reply.id)
    with pytest.raises(openai.NotFoundError) as unknown:
        sdk.responses.create(**GREEDY, input="Hi", previous_response_id=reply.id)
    assert unknown.value.body["param"] == "previous_response_id"


@pytest.fixture(scope="module")
def keyed():
    """The static engine alone, two keys, a short context (200 input tokens)."""
    with static_app(api_key="k1,k2", max_input_tokens=200) as app:
        yield app


def test_each_key_sees_only_its_own_responses(keyed):
    mine, theirs = (sdk_in_process(keyed, "/static/v1", key) for key in ("k1", "k2"))
    reply = mine.responses.create(**GREEDY, input="Say hello.")
    for call in (
        lambda: theirs.responses.retrieve(reply.id),
        lambda: theirs.responses.input_items.list(reply.id),
        lambda: theirs.responses.delete(reply.id),
        lambda: theirs.responses.cancel(reply.id),
        lambda: theirs.responses.create(**GREEDY, input="Hi", previous_response_id=reply.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert mine.responses.retrieve(reply.id).id == reply.id


def test_a_conversation_past_the_context_is_a_400_naming_it_unless_truncation_is_auto(keyed):
    sdk = sdk_in_process(keyed, "/static/v1", "k1")
    long = " ".join(["apple"] * 120)
    first = sdk.responses.create(**GREEDY, input=f"Count these: {long}")
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(**GREEDY, input=f"And these: {long}", previous_response_id=first.id)
    assert refused.value.body["param"] == "previous_response_id", refused.value.body
    cut = sdk.responses.create(**GREEDY, input=f"And these: {long}", previous_response_id=first.id, truncation="auto")
    assert cut.truncation == "auto" and 120 < cut.usage.input_tokens <= 200, cut.usage


def test_a_batch_line_neither_keeps_nor_continues_a_response(keyed):
    """A line runs under the service's own first key (service/jobs/runner.py): it must not write
    into, or read from, that key's responses."""
    client, line = keyed.test_client(), {"environ_overrides": {BATCH_LINE: True}}
    auth = {"Authorization": "Bearer k1"}
    reply = client.post("/static/v1/responses", json={"input": "Say hi.", "max_output_tokens": 4}, headers=auth, **line)
    assert reply.status_code == 200 and reply.json["store"] is False
    assert client.get(f"/static/v1/responses/{reply.json['id']}", headers=auth).status_code == 404
    body = {"input": "Hi", "previous_response_id": "resp_x"}
    refused = client.post("/static/v1/responses", json=body, headers=auth, **line)
    assert refused.status_code == 400 and refused.json["error"]["param"] == "previous_response_id"


@pytest.mark.parametrize(
    ("path", "param"),
    [("/static/v1/responses/r/input_items?limit=0", "limit"), ("/static/v1/responses/r/input_items?order=up", "order")],
)
def test_a_bad_input_items_query_is_a_400_naming_it(keyed, path, param):
    reply = keyed.test_client().get(path, headers={"Authorization": "Bearer k1"})
    assert reply.status_code == 400 and reply.json["error"]["param"] == param, reply.json
