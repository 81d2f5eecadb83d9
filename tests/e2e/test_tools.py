"""Tool calls and the Responses API on both engines (service/tools/spec.py, service/openai/responses/),
through the real `openai` SDK and LangChain against the session's shared gunicorn, every test on
/v1 (vLLM) and /static/v1 (static). Greedy, with two tools: each "ten asks" test sends its asks
at once, from threads, so that the static engine batches them; every reply must be what its
`tool_choice` guarantees, its arguments valid against the function's schema.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import jsonschema
import openai
import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from service.config import Config
from service.openai.chat.protocol import Chat
from service.protocol import validate
from service.tools import parser as tool_replies
from service.tools import prompt as tool_prompt
from service.tools import spec as service_tools
from tests.helpers import BASES, MODEL
from tests.helpers.servers import KEY, nothing_held


@pytest.fixture(scope="module")
def server(shared_server):
    return shared_server  # tests/e2e/conftest.py: the session's gunicorn, API_KEY set


WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
    },
}
ADD = {
    "name": "add",
    "description": "The sum of two numbers",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"],
    },
}
FUNCTIONS = {fn["name"]: fn for fn in (WEATHER, ADD)}
TOOLS = [{"type": "function", "function": fn} for fn in (WEATHER, ADD)]
ASKS = [
    "What is the weather in Paris?",
    "How hot is it in Cairo today, in fahrenheit?",
    "What is 2 plus 3?",
    "Is it raining in London?",
    "Add 17 and 25.",
    "What's the temperature in Tokyo in celsius?",
    "What is 1.5 + 2.25?",
    "Tell me the weather in New York.",
    "Compute 100 plus 250.",
    "Hello! How are you today?",
]
MAX_TOKENS = 40  # a call of either tool is ~27 tokens


def ask(client: openai.OpenAI, content: str, tool_choice, **fields):
    messages = [{"role": "user", "content": content}]
    fields = {"tools": TOOLS, "tool_choice": tool_choice, "temperature": 0, "max_tokens": MAX_TOKENS, **fields}
    return client.chat.completions.create(model=MODEL, messages=messages, **fields)


def ask_all(client: openai.OpenAI, tool_choice) -> list:
    with ThreadPoolExecutor(len(ASKS)) as pool:
        return list(pool.map(lambda content: ask(client, content, tool_choice), ASKS))


def valid_call(choice, names=tuple(FUNCTIONS)) -> bool:
    """One call of one of `names`, in OpenAI's shape, its arguments valid against its schema."""
    calls = choice.message.tool_calls or []
    if choice.finish_reason != "tool_calls" or choice.message.content is not None or len(calls) != 1:
        return False
    [call] = calls
    if not call.id.startswith("call_") or call.type != "function" or call.function.name not in names:
        return False
    try:
        jsonschema.validate(json.loads(call.function.arguments), FUNCTIONS[call.function.name]["parameters"])
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


@BASES
def test_a_named_function_is_called_every_time_with_valid_arguments(sdk, base):
    replies = ask_all(sdk, {"type": "function", "function": {"name": "get_weather"}})
    valid = sum(valid_call(r.choices[0], ("get_weather",)) for r in replies)
    print(f"COUNT {base} named: {valid}/{len(replies)} valid get_weather calls")
    assert valid == len(ASKS), [r.choices[0].model_dump() for r in replies]


@BASES
def test_required_calls_one_of_the_tools_every_time(sdk, base):
    replies = ask_all(sdk, "required")
    valid = sum(valid_call(r.choices[0]) for r in replies)
    names = [r.choices[0].message.tool_calls[0].function.name for r in replies if r.choices[0].message.tool_calls]
    print(f"COUNT {base} required: {valid}/{len(replies)} valid calls ({names.count('add')} of add)")
    assert valid == len(ASKS), [r.choices[0].model_dump() for r in replies]


@BASES
def test_auto_answers_with_a_valid_call_or_text_never_a_malformed_call(sdk, base):
    replies = ask_all(sdk, "auto")
    calls = sum(valid_call(r.choices[0]) for r in replies)
    texts = [r.choices[0] for r in replies if not r.choices[0].message.tool_calls]
    print(f"COUNT {base} auto: {calls} valid calls, {len(texts)} texts, of {len(replies)}")
    assert calls + len(texts) == len(ASKS), [r.choices[0].model_dump() for r in replies]
    for choice in texts:
        assert isinstance(choice.message.content, str) and choice.finish_reason in ("stop", "length"), choice
        assert '"tool_call"' not in choice.message.content, choice  # a call is never left in the text


@BASES
def test_a_streamed_call_reassembles_to_the_whole_reply(sdk, streaming_sdk, base):
    whole = ask(sdk, ASKS[4], "required").choices[0]
    chunks = list(ask(streaming_sdk, ASKS[4], "required", stream=True))
    deltas = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    head, rest = deltas[0], deltas[1:]
    assert head.index == 0 and head.id.startswith("call_") and head.type == "function"
    assert head.function.arguments == "" and head.function.name == whole.message.tool_calls[0].function.name
    assert rest and all(d.id is None and d.function.name is None for d in rest)
    assert "".join(d.function.arguments for d in rest) == whole.message.tool_calls[0].function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)


@BASES
def test_a_follow_up_turn_with_the_tool_result_answers_in_text(sdk):
    first = ask(sdk, ASKS[0], "required").choices[0].message
    call = first.tool_calls[0]
    messages = [
        {"role": "user", "content": ASKS[0]},
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "sunny"}'},
    ]
    reply = sdk.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=24
    )
    message = reply.choices[0].message
    assert message.tool_calls is None and message.content.strip(), reply


@BASES
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]}, "tools"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ],
)
def test_bad_tools_are_a_400_naming_the_field(server, sdk, fields, param):
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], extra_body=fields)
    assert refused.value.body["param"] == param, refused.value.body
    nothing_held(server)


class City(BaseModel):
    name: str = Field(max_length=32)
    country: str = Field(max_length=32)


def langchain(server, base) -> ChatOpenAI:
    return ChatOpenAI(
        model=MODEL, base_url=server.url + base, api_key=KEY, temperature=0, max_tokens=MAX_TOKENS, max_retries=0
    )


@BASES
def test_langchain_structured_output_and_bound_tools(server, base):
    city = langchain(server, base).with_structured_output(City, method="function_calling").invoke("Paris is in France.")
    assert isinstance(city, City), city
    bound = langchain(server, base).bind_tools([WEATHER, ADD], tool_choice="required")
    calls = bound.invoke("What is 2 plus 3?").tool_calls
    assert len(calls) == 1 and calls[0]["name"] in FUNCTIONS, calls
    jsonschema.validate(calls[0]["args"], FUNCTIONS[calls[0]["name"]]["parameters"])


RESPONSE_TOOLS = [{"type": "function", **fn} for fn in (WEATHER, ADD)]


@BASES
def test_responses_create_answers_in_text_or_with_a_call(sdk):
    text = sdk.responses.create(model=MODEL, input="Say hello.", instructions="Be brief.", max_output_tokens=8)
    assert text.output[0].type == "message" and text.output_text and text.usage.output_tokens <= 8
    called = sdk.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": ASKS[0]}],
        tools=RESPONSE_TOOLS,
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,
        max_output_tokens=MAX_TOKENS,
    )
    [item] = called.output
    assert item.type == "function_call" and item.name == "get_weather" and called.status == "completed"
    jsonschema.validate(json.loads(item.arguments), WEATHER["parameters"])


@BASES
def test_responses_stream_sends_the_event_sequence(streaming_sdk):
    kwargs = {"model": MODEL, "input": ASKS[2], "temperature": 0, "max_output_tokens": MAX_TOKENS}
    with streaming_sdk.responses.stream(**kwargs, tools=RESPONSE_TOOLS, tool_choice="required") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"], kinds
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert "response.function_call_arguments.delta" in kinds
    [item] = final.output
    jsonschema.validate(json.loads(item.arguments), FUNCTIONS[item.name]["parameters"])
    with streaming_sdk.responses.stream(model=MODEL, input="Say hello.", max_output_tokens=6, temperature=0) as stream:
        events = list(stream)
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    last = events[-1]  # cut at max_output_tokens: incomplete, as OpenAI ends such a stream
    assert last.type == "response.incomplete" and last.response.incomplete_details.reason == "max_output_tokens"
    assert deltas and "".join(deltas) == last.response.output[0].content[0].text


class Pet(BaseModel):
    name: str = Field(max_length=16)
    species: Literal["cat", "dog", "bird", "fish"]


@BASES
def test_responses_parse_returns_the_model(sdk):
    kwargs = {"model": MODEL, "input": "Rex is a dog.", "temperature": 0, "max_output_tokens": 32}
    reply = sdk.responses.parse(**kwargs, text_format=Pet)
    assert isinstance(reply.output_parsed, Pet), reply


@BASES
@pytest.mark.parametrize(
    ("field", "value"),
    [("include", ["usage"]), ("conversation", "conv_1"), ("reasoning", {"effort": "low"}), ("max_tool_calls", 2)],
)
def test_unimplemented_responses_fields_are_a_400_naming_them(server, sdk, field, value):
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(model=MODEL, input="hi", max_output_tokens=2, extra_body={field: value})
    assert refused.value.body["param"] == field, refused.value.body
    nothing_held(server)


# --- the parts without a server: the grammar's bounds, the prompt, the parse back


def parse_tools(**fields):
    """The tools of a chat body, as its model parses them (service/tools/spec.py's `collect`)."""
    return validate(Chat, {"messages": [{"role": "user", "content": "hi"}], **fields}, None).function_tools


def test_tools_that_constrain_the_reply_get_room_for_a_call_unless_max_tokens_is_named():
    config, body = Config(), {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
    budget = lambda **f: validate(Chat, {**body, **f}, config).to_sampling_params(config).max_tokens  # noqa: E731
    assert budget(tool_choice="required") == min(service_tools.TOOL_MAX_TOKENS, config.max_new_tokens_limit)
    assert budget(tool_choice="required", max_tokens=7) == 7
    assert budget(tool_choice="none") == config.max_new_tokens  # nothing constrains the reply


def test_the_decoder_streams_what_the_whole_reply_parses_to():
    tools = parse_tools(tools=TOOLS)  # auto
    for text in (
        '{"tool_call":{"name":"add","arguments":{"a":2,"b":3}}}',
        '{"response":"It is \\"sunny\\" in Montr\\u00e9al.\\n"}',
    ):
        decoder = tool_replies.Decoder(tools)
        events = [e for ch in text for e in decoder.feed(ch)] + decoder.finish()
        content, call = tool_replies.parse(text, tools)
        if call is not None:
            assert events[0] == ("call", "add") and [k for k, _ in events[1:]] == ["arguments"] * (len(events) - 1)
            assert "".join(part for _, part in events[1:]) == call["function"]["arguments"] == '{"a":2,"b":3}'
        else:
            assert "".join(part for _, part in events) == content == 'It is "sunny" in Montréal.\n'


def test_a_reply_cut_short_is_text_not_a_call():
    tools = parse_tools(tools=TOOLS, tool_choice="required")
    cut = '{"tool_call":{"name":"add","arguments":{"a":2'
    assert tool_replies.parse(cut, tools) == (cut, None)


def test_free_strings_and_arrays_get_a_bound_and_the_rest_is_kept():
    schema = {"type": "object", "properties": {"s": {"type": "string"}, "e": {"type": "string", "enum": ["x"]}}}
    schema["properties"]["l"] = {"type": "array", "items": {"type": "string", "maxLength": 3}}
    out = service_tools.bounded(schema)["properties"]
    assert out["s"]["maxLength"] == service_tools.STRING_MAX_LENGTH and "maxLength" not in out["e"]
    assert out["l"]["maxItems"] == service_tools.ARRAY_MAX_ITEMS and out["l"]["items"]["maxLength"] == 3


def test_the_prompt_states_the_tools_and_writes_the_tool_turns_in_our_format():
    tools = parse_tools(tools=TOOLS, tool_choice="auto")
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a":1,"b":2}'}}
    history = [
        {"role": "user", "content": "1+2?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
    ]
    system, user, assistant, result = tool_prompt.plain(history, tools)
    assert system["role"] == "system" and '"name":"get_weather"' in system["content"]
    assert '{"response":' in system["content"]  # auto: a text answer is allowed, and said so
    assert assistant == {"role": "assistant", "content": '{"tool_call":{"name":"add","arguments":{"a":1,"b":2}}}'}
    assert result == {"role": "user", "content": "Result of add: 3"} and user == history[0]
