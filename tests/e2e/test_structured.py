"""Structured outputs on both engines: JSON schema, JSON object, choice, regex and grammar.

The HTTP tests run on the real gunicorn (tests/e2e/conftest.py's shared one: both engines, float32
so that they can agree), each on /v1 (vLLM) and /static/v1 (static), and on the demo routes where a
request carries one `structured_outputs` for all its prompts; the request parser's rules beside
them. The mixed static round and the per-row mask on the Runner: tests/integration/test_structured.py.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import jsonschema
import openai
import pytest
import requests
from pydantic import BaseModel, Field

from batcher.sampling import SamplingParams
from service.config import Config
from service.errors import InvalidRequest
from service.protocol import validate
from service.protocol.sampling import Sampling
from service.structured import cache_limit_bytes, compile_params
from tests.helpers.servers import KEY, auth

MODEL = "SmolLM2-135M-Instruct"
DEMO = {"/v1": ("/generate_vllm", "/generate_vllm_stream"), "/static/v1": ("/generate", "/generate_stream")}
BASES = pytest.mark.parametrize("base", list(DEMO))
DATE = r"\d{4}-\d{2}-\d{2}"
SUM_GRAMMAR = 'root ::= "(" digit digit? " " ("+" | "-") " " digit digit? ")"\ndigit ::= [0-9]'
SUM_PATTERN = r"\(\d\d? [+-] \d\d?\)"
LIMIT = cache_limit_bytes(Config())  # the grammar cache's cap, as the service sets it


class Pet(BaseModel):
    name: str = Field(max_length=16)
    species: Literal["cat", "dog", "bird", "fish"]
    age: int = Field(ge=0, le=30)


PETS = [
    "Rex is a 3 year old dog.",
    "Our cat Luna is 7.",
    "Tweety, a bird, just turned 2.",
    "Nemo the fish is 1 year old.",
    "Max is my 12 year old dog.",
    "Whiskers, our cat, is 15 years old.",
    "A parrot called Kiwi, aged 20.",
    "Bella the puppy is 1.",
    "Goldie is a goldfish, 4 years old.",
    "Shadow is a black cat of 9.",
]
ORDER = {
    "type": "object",
    "properties": {
        "status": {"enum": ["open", "paid", "shipped"]},
        "customer": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"}},
            "required": ["name", "age"],
        },
        "items": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 2, "maxItems": 3},
        "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
    },
    "required": ["status", "customer", "items", "quantity"],
}
ORDERS = [
    "Ann (34) paid for 2 apples and a pear.",
    "Order from Bob, 51: shoes and socks, still open.",
    "Shipped to Carla, aged 28: a lamp, a rug and a chair.",
]


def chat(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


@pytest.fixture(scope="module")
def server(shared_server):
    return shared_server  # tests/e2e/conftest.py: the session's gunicorn, both engines, float32, API_KEY set


@pytest.fixture
def sdk(server, base) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + base, api_key=KEY, max_retries=0, _strict_response_validation=True)


def openai_post(server, base: str, path: str, body: dict) -> requests.Response:
    return requests.post(f"{server.url}{base}{path}", json={"model": MODEL, **body}, headers=auth(), timeout=300)


def nothing_left(server) -> bool:
    static, vllm = server.engine("static"), server.engine("vllm")
    return (static["queued"], static["inflight"], vllm["queued"], vllm["running"]) == (0, 0, 0, 0)


# --- what is supported -------------------------------------------------------------------------
@BASES
def test_models_say_which_kinds_are_supported(sdk):
    [card] = sdk.models.list().data
    assert card.model_extra["structured_outputs"] == {
        "response_format": ["text", "json_object", "json_schema"],
        "structured_outputs": ["json", "json_object", "regex", "choice", "grammar", "structural_tag"],
    }


# --- the SDK's parse() -------------------------------------------------------------------------
@BASES
@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 7}], ids=["greedy", "seeded"])
def test_the_sdks_parse_returns_a_parsed_object_for_ten_prompts(sdk, sampling):
    def parse(text: str):
        content = f"Describe the pet as JSON (name, species, age): {text}"
        return sdk.chat.completions.parse(
            model=MODEL, messages=chat(content), response_format=Pet, max_tokens=48, **sampling
        )

    with ThreadPoolExecutor(len(PETS)) as pool:  # concurrent: they share rounds and steps
        replies = list(pool.map(parse, PETS))
    for reply in replies:
        [choice] = reply.choices
        assert choice.finish_reason == "stop", choice.message.content  # it ended by itself, every time
        assert isinstance(choice.message.parsed, Pet), choice.message.content


# --- JSON object and JSON schema ---------------------------------------------------------------
@BASES
def test_json_object_output_always_parses_as_json(server, base):
    prompts = [f"Describe this as a JSON object: {text}" for text in PETS[:4]]
    r = openai_post(
        server,
        base,
        "/completions",
        {"prompt": prompts, "max_tokens": 48, "temperature": 0, "response_format": {"type": "json_object"}},
    )
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        assert choice["finish_reason"] == "stop", choice
        assert isinstance(json.loads(choice["text"]), dict)


@BASES
def test_json_schema_output_always_validates(sdk):
    def ask(text: str) -> str:
        fmt = {"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER}}
        reply = sdk.chat.completions.create(
            model=MODEL, messages=chat(f"The order as JSON: {text}"), response_format=fmt, max_tokens=80, temperature=0
        )
        assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
        return reply.choices[0].message.content

    with ThreadPoolExecutor(len(ORDERS)) as pool:
        texts = list(pool.map(ask, ORDERS))
    for text in texts:
        jsonschema.validate(json.loads(text), ORDER)  # the enum, the nested object, minItems, the integer
        assert json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False) == text  # compact


def test_both_engines_give_the_same_greedy_json(server):
    fmt = {"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER}}
    body = {"messages": chat(f"The order as JSON: {ORDERS[0]}"), "max_tokens": 80, "temperature": 0}
    texts = [openai_post(server, base, "/chat/completions", {**body, "response_format": fmt}).json() for base in DEMO]
    assert texts[0]["choices"][0]["message"]["content"] == texts[1]["choices"][0]["message"]["content"]


# --- choice, regex, grammar, on the OpenAI and the demo routes ---------------------------------
CASES = {
    "choice": ({"choice": ["yes", "no", "maybe"]}, lambda text: text in ("yes", "no", "maybe")),
    "regex": ({"regex": DATE}, lambda text: re.fullmatch(DATE, text)),
    "grammar": ({"grammar": SUM_GRAMMAR}, lambda text: re.fullmatch(SUM_PATTERN, text)),
}
QUESTIONS = ["Is the sky blue?", "When did the Berlin wall fall?", "What is seven plus five?"]


@BASES
@pytest.mark.parametrize("kind", list(CASES))
def test_choice_regex_and_grammar_are_obeyed_on_the_openai_route(server, base, kind):
    spec, obeyed = CASES[kind]
    for question in QUESTIONS:
        r = openai_post(
            server,
            base,
            "/chat/completions",
            {"messages": chat(question), "max_tokens": 16, "temperature": 0, "structured_outputs": spec},
        )
        assert r.status_code == 200, r.text
        [choice] = r.json()["choices"]
        assert obeyed(choice["message"]["content"]) and choice["finish_reason"] == "stop", choice


@BASES
@pytest.mark.parametrize("kind", list(CASES))
def test_the_demo_routes_apply_one_spec_to_every_prompt(server, base, kind):
    spec, obeyed = CASES[kind]
    body = {"prompts": QUESTIONS, "max_tokens": 16, "structured_outputs": spec, "details": True}
    r = requests.post(server.url + DEMO[base][0], json=body, headers=auth(), timeout=300)
    assert r.status_code == 200, r.text
    assert all(obeyed(text) for text in r.json()["generated_texts"]), r.json()["generated_texts"]
    assert [d["finish_reason"] for d in r.json()["details"]] == ["stop"] * 3


def test_logprobs_are_of_the_masked_scores_on_both_engines(server):
    """vLLM masks before it computes logprobs; the static engine's mask comes first too, so the
    chosen tokens' logprobs agree (they would not if one engine recorded them before the mask)."""
    body = {"prompts": QUESTIONS, "max_tokens": 8, "structured_outputs": {"choice": ["yes", "no", "maybe"]}}
    vllm, static = (  # DEMO's order: /v1, then /static/v1
        requests.post(server.url + DEMO[b][0], json={**body, "logprobs": 0}, headers=auth(), timeout=300).json()
        for b in DEMO
    )
    assert static["generated_texts"] == vllm["generated_texts"]
    for s_records, v_records in zip(static["logprobs"], vllm["logprobs"], strict=True):
        assert [r["token_id"] for r in s_records] == [r["token_id"] for r in v_records]
        for s, v in zip(s_records, v_records, strict=True):
            assert s["logprob"] == pytest.approx(v["logprob"], abs=1e-3)


# --- streaming ---------------------------------------------------------------------------------
@BASES
def test_streamed_pieces_join_into_the_same_valid_json(server, base):
    fmt = {"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER}}
    body = {
        "messages": chat(f"The order as JSON: {ORDERS[1]}"),
        "max_tokens": 80,
        "temperature": 0,
        "response_format": fmt,
    }
    client = openai.OpenAI(base_url=server.url + base, api_key=KEY, max_retries=0)
    # the demo routes, with the same spec as structured_outputs (/generate takes `prompts`)
    demo = {"max_tokens": 80, "structured_outputs": {"json": ORDER}}
    demo_prompt = body["messages"][0]["content"]
    asks = {
        "plain": lambda: openai_post(server, base, "/chat/completions", body).json(),
        "stream": lambda: list(client.chat.completions.create(model=MODEL, stream=True, **body)),
        "demo": lambda: requests.post(
            server.url + DEMO[base][0], json={**demo, "prompts": [demo_prompt]}, headers=auth(), timeout=300
        ).json(),
        "demo_stream": lambda: (
            requests.post(
                server.url + DEMO[base][1], json={**demo, "prompt": demo_prompt}, headers=auth(), timeout=300
            ).text
        ),
    }
    # all four at once: greedy fp32 gives each the tokens it gets alone (they share a static round,
    # or vLLM's steps), and one round costs a quarter of four one after another
    with ThreadPoolExecutor(len(asks)) as pool:
        got = dict(zip(asks, pool.map(lambda ask: ask(), asks.values()), strict=True))
    plain, chunks = got["plain"]["choices"][0]["message"]["content"], got["stream"]
    joined = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert joined == plain and len(chunks) > 5
    jsonschema.validate(json.loads(joined), ORDER)
    lines = got["demo_stream"].split("\n\n")
    events = [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: ")]
    assert "".join(e.get("token", "") for e in events) == got["demo"]["generated_texts"][0]
    assert events[-1]["finish_reason"] == "stop"


# --- bad specs ---------------------------------------------------------------------------------
BAD = {
    "schema is not JSON Schema": (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
        "response_format",
    ),
    "json_schema without schema": (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        "response_format",
    ),
    "regex does not compile": ({"structured_outputs": {"regex": "(ab"}}, "structured_outputs"),
    "empty choice": ({"structured_outputs": {"choice": []}}, "structured_outputs"),
    "grammar does not parse": ({"structured_outputs": {"grammar": 'root ::= "a" |'}}, "structured_outputs"),
    "two kinds at once": ({"structured_outputs": {"regex": "a+", "choice": ["a"]}}, "structured_outputs"),
    "both fields at once": (
        {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
        "response_format",
    ),
}


@BASES
@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_spec_is_a_400_naming_the_field_and_leaves_nothing_behind(server, base, case):
    extra, param = BAD[case]
    for path, body in (("/chat/completions", {"messages": chat("Hi")}), ("/completions", {"prompt": "Hi"})):
        r = openai_post(server, base, path, {**body, **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    demo = requests.post(server.url + DEMO[base][0], json={"prompts": ["Hi"], **extra}, headers=auth(), timeout=60)
    assert demo.status_code == 422 and param in demo.json()["error"], demo.text
    assert nothing_left(server)
    ok = openai_post(server, base, "/completions", {"prompt": "Hi", "max_tokens": 2})
    assert ok.status_code == 200  # the engines run on


@BASES
def test_a_schema_keyword_xgrammar_does_not_enforce_is_a_400_on_both_engines(server, base):
    """uniqueItems compiles in xgrammar without being enforced: vLLM's request check refuses it
    (a 500 here once), and the static engine would drop it silently. A 400 on both, nothing stays."""
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    r = openai_post(server, base, "/completions", {"prompt": "Hi", "structured_outputs": {"json": schema}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "structured_outputs", r.text
    assert "xgrammar" in r.json()["error"]["message"]
    assert nothing_left(server)


def parse_structured(body: dict):
    """The body's constraint as its model reads it, not compiled yet."""
    return validate(Sampling, body, Config()).to_sampling_params(Config()).structured


@pytest.mark.parametrize(
    "body, kind",
    [
        ({"response_format": {"type": "text"}}, None),
        ({"structured_outputs": {"json": json.dumps(ORDER)}}, "json"),  # a schema as JSON text, as vLLM takes it
        ({"structured_outputs": {"json_object": True, "disable_any_whitespace": True}}, "json_object"),
        ({"structured_outputs": {"grammar": 'start: "a" | "b"'}}, "grammar"),  # Lark, as vLLM tells them apart
    ],
)
def test_the_parser_accepts_vllms_spellings(body, kind):
    spec = parse_structured(body)
    assert (spec.kind if spec else None) == kind and (spec is None or spec.compiled is None)  # compiled at submit
    compiled = compile_params(SamplingParams(structured=spec), Config()).structured
    assert spec is None or (compiled == spec and compiled.compiled is not None)


@pytest.mark.parametrize(
    "outputs",
    [
        {"whitespace_pattern": " "},
        {"regex": "a", "disable_any_whitespace": False},
        {"json_object": False},
        {"regx": "a"},
    ],
)
def test_the_parser_refuses_what_it_does_not_implement(outputs):
    with pytest.raises(InvalidRequest) as refused:
        parse_structured({"structured_outputs": outputs})
    assert refused.value.param == "structured_outputs"


@pytest.mark.parametrize("extra", [{"ignore_eos": True}, {"min_tokens": 3}])
def test_a_grammar_that_decides_the_end_refuses_ignore_eos_and_min_tokens(extra):
    """Once the grammar is complete only EOS is allowed, and these ban it: every token masked."""
    with pytest.raises(InvalidRequest) as refused:
        parse_structured({"response_format": {"type": "json_object"}, **extra})
    assert refused.value.param == "response_format"
    assert parse_structured({"response_format": {"type": "text"}, **extra}) is None
