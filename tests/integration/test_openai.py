"""The OpenAI SDK's exceptions for the errors a healthy server does not make on demand (a failed
round, a deadline passed after admission), on apps in this process through httpx's WSGI
transport, on both base URLs. The SDK against the real gunicorn: tests/e2e/test_openai.py."""

from __future__ import annotations

import httpx
import openai
import pytest

from service.http.state import app_state
from tests.helpers import BASES, MODEL, PARIS
from tests.helpers.apps import own_app


def sdk_in_process(app, base: str) -> openai.OpenAI:
    """The SDK on an app in this process, through httpx's WSGI transport."""
    transport = httpx.WSGITransport(app=app)
    return openai.OpenAI(
        base_url=f"http://service{base}", api_key="-", max_retries=0, http_client=httpx.Client(transport=transport)
    )


@pytest.fixture
def in_process(vllm_app, base) -> openai.OpenAI:
    """The SDK on the session's app in this process (tests/integration/conftest.py's): for the errors a
    healthy server does not make on demand."""
    return sdk_in_process(vllm_app, base)


@BASES
def test_a_failed_round_is_a_500_and_a_hopeless_deadline_a_429_as_the_sdks_exceptions(
    vllm_app, in_process, base, monkeypatch
):
    def broken(*args, **kwargs):
        raise RuntimeError("the accelerator caught fire")

    engine = app_state(vllm_app).engines["vllm" if base == "/v1" else "static"]
    with monkeypatch.context() as patch:  # the engine's model call fails once the prompt runs
        if base == "/v1":
            patch.setattr(engine.engine, "step", broken)
        else:
            patch.setattr(engine.runner, "generate", broken)
        with pytest.raises(openai.InternalServerError) as failed:
            in_process.completions.create(model=MODEL, prompt=PARIS, max_tokens=2)
    assert failed.value.status_code == 500 and failed.value.body["code"] == "generation_failed"
    assert "caught fire" in failed.value.body["message"]

    in_process.completions.create(model=MODEL, prompt=PARIS, max_tokens=2)  # measured: it predicts
    # no first token comes within 0 ms: refused at once, as predicted (an idle engine, too, holds
    # a client's own deadline)
    with pytest.raises(openai.RateLimitError) as late:
        in_process.completions.create(model=MODEL, prompt=PARIS, max_tokens=50, extra_headers={"X-Max-Queue-Ms": "0"})
    assert late.value.status_code == 429 and late.value.body["code"] == "wait_too_long"
    assert int(late.value.response.headers["Retry-After"]) >= 1
    assert in_process.completions.create(model=MODEL, prompt=PARIS, max_tokens=2, temperature=0).choices[0].text


@BASES
def test_a_deadline_passed_after_admission_is_a_504_as_the_sdks_exception(base, tmp_path):
    # an app of its own (vLLM only for /v1) whose REQUEST_TIMEOUT_S is a microsecond and no machine
    # profile: admitted (its fresh engine prices nothing and is idle), and no round ends within it
    with own_app(vllm_enabled=base == "/v1", request_timeout_s=0.000001, profile_dir=str(tmp_path)) as app:
        with pytest.raises(openai.InternalServerError) as late:
            sdk_in_process(app, base).completions.create(model=MODEL, prompt=PARIS, max_tokens=50)
    assert late.value.status_code == 504 and late.value.body["code"] == "deadline_exceeded"
