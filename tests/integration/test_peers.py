"""bench/peers.py's launcher: a peer is used once it answers GET /v1/models, and stopped after;
one that exits first is reported, not waited for. A stand-in peer (Python's http.server serving a
folder that holds v1/models) keeps llama.cpp and vLLM out of it."""

from __future__ import annotations

import sys

import pytest
import requests

from bench import peers


def test_a_peer_is_used_once_it_answers_and_stopped_after(tmp_path):
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "models").write_text('{"data": [{"id": "m"}]}')
    cmd = [sys.executable, "-m", "http.server", "{port}", "--bind", "127.0.0.1", "--directory", str(tmp_path)]
    with peers.launched("stand-in", cmd, tmp_path / "log") as urls:
        url = urls["stand-in"]
        assert requests.get(f"{url}/v1/models", timeout=5).json()["data"][0]["id"] == "m"
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{url}/v1/models", timeout=5)


def test_a_peer_that_exits_before_it_answers_is_reported(tmp_path):
    with pytest.raises(RuntimeError, match="exited with code 3"):
        with peers.launched("broken", [sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "log"):
            pass
