"""The unit tier: each module's rules on their own, with no model and no server, in seconds:
`make check` runs it, after the lint, and imports no other test module. A test that needs the model
or the app in this process belongs in tests/integration; one that needs a real gunicorn, in
tests/e2e."""

from __future__ import annotations

import sys

import pytest

MODEL_LIBRARIES = ("torch", "transformers", "vllm")


@pytest.fixture(autouse=True)
def no_model():
    """Fails a unit test that imports torch, transformers or vLLM while it runs (their imports
    alone take seconds on one core here; a module that imports one at its top shows in `make
    check`'s time, which is kept under 60 s)."""
    before = {name for name in MODEL_LIBRARIES if name in sys.modules}
    yield
    loaded = sorted({name for name in MODEL_LIBRARIES if name in sys.modules} - before)
    assert not loaded, f"a unit test loads no model, and this one imported {loaded}: tests/integration"
