"""The body models (each API's protocol.py) without a model or a server: the errors they give, in the
documented shapes, and the docs' parameter tables checked against them (docs/api.md's sampling
table, docs/openai.md's field table and Responses table), so that neither can drift."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.config import Config
from service.demo import protocol as demo
from service.errors import InvalidDeadline, InvalidRequest, TooManyPrompts, UnknownField
from service.openai import fields as openai_fields
from service.openai.chat.protocol import Chat
from service.openai.completions.protocol import Completion
from service.openai.responses.protocol import Responses
from service.protocol import names, validate
from service.protocol.sampling import Sampling

DOCS = Path(__file__).resolve().parents[2] / "docs"
CONFIG = Config(max_prompts_per_request=8)
NAME = re.compile(r"`([a-z_]+(?:\.[a-z_]+)?)`")


def test_unknown_demo_fields_are_named_each_with_its_nearest_known_name():
    with pytest.raises(UnknownField) as caught:
        validate(demo.Generate, {"prompts": ["Hi"], "max_new_tokens": 3, "zzz": 1, "temperature": "x"}, CONFIG)
    assert caught.value.status == 400 and caught.value.param == "max_new_tokens"
    assert "unknown fields 'max_new_tokens' (did you mean 'max_tokens'?), 'zzz'; this route takes" in str(caught.value)


@pytest.mark.parametrize(
    ("model", "body", "error", "param", "words"),
    [
        (demo.Generate, {}, InvalidRequest, "prompts", "'prompts' is required"),
        (demo.Generate, {"prompts": ["ok", " "]}, InvalidRequest, "prompts", "'prompts[1]': is empty"),
        (demo.Generate, {"prompts": ["p"] * 9}, TooManyPrompts, "prompts", "9 prompts; at most 8"),
        (demo.Generate, {"prompts": [], "max_queue_ms": -1}, InvalidDeadline, "max_queue_ms", "greater than"),
        (demo.Generate, {"prompts": [], "n": 9}, InvalidRequest, "n", "at most 8 (MAX_N)"),
        (demo.Single, {"prompt": "Hi", "n": 2}, InvalidRequest, "n", "less than or equal to 1"),
        (Completion, {"prompt": [[1], [2]] * 5}, TooManyPrompts, "prompt", "10 prompts"),
        (Completion, {"prompt": [[]]}, InvalidRequest, "prompt", "'prompt"),
        (Chat, {"messages": [{"content": "Hi"}]}, InvalidRequest, "messages", "'messages[0].role' is required"),
        (Chat, {"messages": [{"role": "user"}], "stop": ""}, InvalidRequest, "stop", "at least 1 character or"),
        (
            Chat,
            {"messages": [{"role": "user"}], "stream_options": {"include_usage": 1}},
            InvalidRequest,
            "stream_options",
            "boolean",
        ),
    ],
)
def test_an_invalid_body_raises_the_documented_error_naming_its_field(model, body, error, param, words):
    with pytest.raises(error) as caught:
        validate(model, body, CONFIG)
    assert type(caught.value) is error and caught.value.param == param and words in str(caught.value), caught.value


def test_the_openai_bodies_keep_a_name_nobody_defined_and_the_demo_ones_refuse_it():
    fields = validate(Completion, {"prompt": "Hi", "a_field_nobody_defined": {"x": 1}}, CONFIG)
    assert fields.model_extra == {"a_field_nobody_defined": {"x": 1}}
    with pytest.raises(UnknownField):
        validate(demo.Single, {"prompt": "Hi", "a_field_nobody_defined": 1}, CONFIG)


def _table(text: str, heading: str) -> list[list[str]]:
    """The rows (cells) of the first table after `heading`."""
    after = text[text.index(heading) :]
    rows = re.findall(r"^\|(.+)\|$", after[after.index("\n|") :].split("\n\n", 1)[0], re.MULTILINE)
    return [[cell.strip() for cell in row.split("|")] for row in rows[2:]]


def _bounds(field: str) -> dict:
    """The number branch of a Sampling field's JSON schema: its minimum, maximum, ..."""
    prop = Sampling.model_json_schema()["properties"][field]
    branch = next(b for b in prop.get("anyOf", [prop]) if b.get("type") in ("integer", "number"))
    return {k: v for k, v in branch.items() if "imum" in k or k == "x-at-most"}


RANGES = {  # how docs/api.md writes a range -> the JSON schema bounds it means
    r"^`?(-?\d+)\.\.(-?\d+)`?$": lambda lo, hi: {"minimum": int(lo), "maximum": int(hi)},
    r"^\((\d+), (\d+)\]$": lambda lo, hi: {"exclusiveMinimum": int(lo), "maximum": int(hi)},
    r"^> (\d+)$": lambda lo: {"exclusiveMinimum": int(lo)},
    r"^(\d+)\.\.`([A-Z_]+)`.*$": lambda lo, setting: {"minimum": int(lo), "x-at-most": setting.lower()},
}


def test_docs_api_sampling_table_is_the_models_fields_and_ranges():
    rows = _table((DOCS / "api.md").read_text(), "### Sampling controls")
    documented = {NAME.match(row[0]).group(1): row[1] for row in rows}
    assert (
        set(documented) | {"details", "max_queue_ms"} == set(names(demo.Generate)) - {"prompts"} == set(names(Sampling))
    )
    checked = 0
    for field, written in documented.items():
        for pattern, meaning in RANGES.items():
            match = re.match(pattern, written)
            if match:
                assert _bounds(field) == meaning(*match.groups()), (field, written, _bounds(field))
                checked += 1
    assert checked >= 8  # the patterns still read the table


def test_docs_openai_field_table_is_the_routes_tables():
    rows = {row[0]: set(NAME.findall(row[1])) for row in _table((DOCS / "openai.md").read_text(), "One table says it")}
    [honoured] = [v for k, v in rows.items() if k.startswith("honoured")]
    [ignored] = [v for k, v in rows.items() if k.startswith("accepted and ignored")]
    [refused] = [v for k, v in rows.items() if k.startswith("refused")]
    for route in (openai_fields.COMPLETIONS, openai_fields.CHAT):
        for name, rule in route.items():
            if name.startswith("guided_"):
                continue  # "the removed `guided_*` fields"
            where = {"honoured": honoured, "ignored": ignored, "refused": refused}[rule.does]
            assert name in where or any(n.startswith(f"{name}.") for n in where), (name, rule.does)


def test_docs_openai_responses_table_is_the_model():
    rows = _table((DOCS / "openai.md").read_text(), "the Responses API, stored")
    documented = {name.split(".")[0] for row in rows for name in NAME.findall(row[0])}
    ignored = {name for row in rows if row[0] == "ignored" for name in NAME.findall(row[1])}
    assert set(names(Responses)) <= documented
    assert {name for name, rule in openai_fields.RESPONSES.items() if rule.does == "ignored"} <= ignored


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data", None],
)
def test_a_body_not_sent_as_json_is_a_415_before_it_is_read(content_type):
    """What a web page on another origin can make a browser send without a CORS preflight."""
    from flask import Flask, request

    from service.errors import UnsupportedMediaType
    from service.http.body import json_body

    headers = {} if content_type is None else {"Content-Type": content_type}
    with Flask(__name__).test_request_context("/", method="POST", data='{"prompts": ["Hi"]}', headers=headers):
        with pytest.raises(UnsupportedMediaType) as refused:
            json_body(request)
    assert refused.value.status == 415 and "application/json" in str(refused.value)


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8", "application/x+json"])
def test_json_in_any_charset_or_a_json_suffix_type_is_read(content_type):
    from flask import Flask, request

    from service.http.body import json_body

    headers = {"Content-Type": content_type}
    with Flask(__name__).test_request_context("/", method="POST", data='{"prompts": ["Hi"]}', headers=headers):
        assert json_body(request) == {"prompts": ["Hi"]}
