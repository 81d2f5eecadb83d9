"""GET /openapi.json: valid OpenAPI 3.1 (against the 3.1 meta schema Schemathesis ships), every
component a valid JSON Schema 2020-12, each route family listed once per engine it is registered
for, the error shape each blueprint answers in, this app's settings as the bounds. On an app
built without its engines (nothing to run: the document is the app's routes and models)."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest
from schemathesis.specs.openapi.definitions import OPENAPI_31

from service import create_app
from service.config import Config
from service.demo import routes as demo
from service.http.state import app_state
from service.openai.router import FAMILIES
from service.ops.openapi import document
from service.protocol.limits import MARK


@pytest.fixture(scope="module")
def app():
    return create_app(Config.from_env(max_n=3), start=False)


@pytest.fixture(scope="module")
def doc(app) -> dict:
    reply = app.test_client().get("/openapi.json")
    assert reply.status_code == 200 and reply.mimetype == "application/json"
    return reply.json


def test_it_is_valid_openapi_3_1(doc):
    assert doc["openapi"].startswith("3.1.")
    jsonschema.Draft202012Validator(OPENAPI_31).validate(doc)
    for schema in doc["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)  # raises, naming what is wrong
    refs = {ref for ref in _values(doc, "$ref")}
    targets = {f"#/components/{kind}/{name}" for kind in ("schemas", "responses") for name in doc["components"][kind]}
    assert refs and refs <= targets, refs - targets


def test_every_registered_base_url_has_its_paths(doc):
    paths = set(doc["paths"])
    for prefix in FAMILIES["openai"][1].values():  # /v1 and /static/v1
        for route in ("/completions", "/chat/completions", "/responses", "/models"):
            assert prefix + route in paths
        assert set(doc["paths"][f"{prefix}/batches"]) == {"get", "post"}  # the Batch API's create and list
        assert set(doc["paths"][f"{prefix}/files"]) == {"get", "post"}
        upload = doc["paths"][f"{prefix}/files"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
        assert upload["properties"]["file"] == {"type": "string", "format": "binary"}
        assert set(doc["paths"][f"{prefix}/responses/{{response_id}}"]) == {"get", "delete"}
        for path in ("responses/{response_id}/input_items", "files/{file_id}/content"):
            assert set(doc["paths"][f"{prefix}/{path}"]) == {"get"}
        for path in ("responses/{response_id}/cancel", "batches/{batch_id}/cancel"):
            [param] = doc["paths"][f"{prefix}/{path}"]["post"]["parameters"]
            assert param["in"] == "path" and param["required"] is True
    for prefix in FAMILIES["tokenize"][1].values():  # /tokenize and /static/tokenize
        assert {f"{prefix}/tokenize", f"{prefix}/detokenize"} <= paths
    for urls in demo.ROUTES.values():
        assert set(urls.values()) <= paths
    assert {"/race", "/health"} <= paths
    assert not any("<" in path or "{unknown}" in path for path in paths)  # the catch-all under /v1 is no operation


def test_each_operation_documents_the_error_shape_its_routes_answer_in(doc):
    def error_of(path: str) -> str:
        [op] = doc["paths"][path].values()
        return op["responses"]["400"]["$ref"].rsplit("/", 1)[-1]

    for path in ("/v1/completions", "/static/v1/chat/completions", "/static/tokenize", "/detokenize"):
        assert error_of(path) == "OpenAIError"
    for path in ("/generate", "/generate_vllm_stream", "/basic_generate", "/race"):
        assert error_of(path) == "DemoError"
    shape = doc["components"]["schemas"]["OpenAIErrorBody"]
    assert set(shape["required"]) == {"message", "type", "param", "code"}


def test_the_bounds_that_are_settings_carry_this_apps_values(app, doc):
    props = doc["components"]["schemas"]["Generate"]["properties"]
    config = app_state(app).config
    assert [b.get("maximum") for b in props["n"]["anyOf"]] == [3, None]  # MAX_N=3 here
    assert props["max_tokens"]["anyOf"][0]["maximum"] == config.max_new_tokens_limit
    assert props["prompts"]["maxItems"] == config.max_prompts_per_request
    assert MARK not in json.dumps(doc)
    other = dataclasses.replace(config, max_n=5)
    with app.app_context():
        app_state(app).config = other
        try:
            again = document(app)
        finally:
            app_state(app).config = config
    assert again["components"]["schemas"]["Generate"]["properties"]["n"]["anyOf"][0]["maximum"] == 5


def test_the_demo_bodies_forbid_unknown_fields_and_the_openai_ones_allow_them(doc):
    schemas = doc["components"]["schemas"]
    assert schemas["Generate"]["additionalProperties"] is False and schemas["Single"]["additionalProperties"] is False
    assert schemas["Completion"]["additionalProperties"] is True and schemas["Chat"]["additionalProperties"] is True


def _values(node, key: str):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield v
            else:
                yield from _values(v, key)
    elif isinstance(node, list):
        for item in node:
            yield from _values(item, key)


def test_it_is_built_once_and_then_served_as_built(monkeypatch):
    """An open route anyone may call in a loop: the document is built at the first call only."""
    import service.ops.openapi as module

    built = []
    monkeypatch.setattr(module, "document", lambda app: built.append(app) or document(app))
    app = create_app(Config.from_env(), start=False)
    replies = [app.test_client().get("/openapi.json") for _ in range(3)]
    assert len(built) == 1 and all(r.status_code == 200 for r in replies)
    assert replies[0].get_data() == replies[2].get_data() and replies[2].json["openapi"] == "3.1.0"
