"""/tokenize and /detokenize on the real gunicorn, which sets API keys: refused without the key or
with a wrong one, answered with it, on both prefixes. What they answer: tests/integration/test_tokenization.py."""

from __future__ import annotations

import pytest
import requests

from tests.helpers.servers import auth

PREFIXES = pytest.mark.parametrize("prefix", ["", "/static"])


@PREFIXES
@pytest.mark.parametrize("path, body", [("tokenize", {"prompt": "hi"}), ("detokenize", {"tokens": [1]})])
def test_the_api_key_is_required_when_set(shared_server, prefix, path, body):
    url = f"{shared_server.url}{prefix}/{path}"  # tests/e2e/conftest.py: it sets API keys
    none = requests.post(url, json=body, timeout=60)
    assert none.status_code == 401 and none.json()["error"]["code"] == "invalid_api_key"
    wrong = requests.post(url, json=body, headers={"Authorization": "Bearer nope"}, timeout=60)
    assert wrong.status_code == 401
    ok = requests.post(url, json=body, headers=auth(), timeout=60)
    assert ok.status_code == 200
