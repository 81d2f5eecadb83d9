"""The e2e tier: the service as it is deployed, a real gunicorn (deploy/server.py, the launcher
the benchmark uses), `make serve` (tests/helpers/make_serve.py), the cluster and the test hosts,
driven over HTTP. The servers that several modules share start once per session, when a module
first asks; a test that needs other settings starts its own."""

from __future__ import annotations

import openai
import pytest

from tests.helpers import PINNED, pin_environment
from tests.helpers.make_serve import MakeServe
from tests.helpers.servers import KEY, STATIC_SERVER_QUEUE, serving

# DTYPE=float32, STATIC_COMPILE=0, VLLM_ENFORCE_EAGER=1 where the environment does not say
# otherwise (PINNED, tests/helpers/__init__.py), set here, at import: every server, replica and
# `make serve` a test starts inherits it unless its own env says otherwise (`served` asks for
# `auto`, the defaults a user runs).
pin_environment()


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory):
    """One real gunicorn, both engines ready, for the modules that only send it requests
    (test_e2e, test_openai, test_openai_fields, test_structured, test_tools, test_fuzz, test_page,
    test_tokenization):
    each start loads both engines, a minute or more on 2 cores, so it starts once, when a module
    first asks, and stops at the end of the session. Its settings satisfy all of them: two API
    keys (test_openai checks that either one is taken, test_page that the page asks for one), at
    most 8 prompts a request (test_openai's 413 at 9), and PINNED's fp32 eager on both engines:
    its tests compare the two engines token for token, while the profile may pick a different
    dtype per engine (on the AMD EPYC here, 2026-12-01: static fp16, vLLM fp32), so the defaults
    are not what they test (`served`, lm-eval's, runs at the defaults). A test that changes a
    server's state or needs other settings starts its own; one that reads the log or the metrics
    reads what its own requests added (`Server.log_mark`)."""
    env = {"API_KEY": f"other-key,{KEY}", "MAX_PROMPTS_PER_REQUEST": "8", "THREADS": "32", **PINNED}
    with serving(tmp_path_factory.mktemp("shared"), env) as srv:
        yield srv


@pytest.fixture(scope="session")
def served(tmp_path_factory):
    """`make serve` at this machine's defaults (every `auto` from its profile, not PINNED: what a
    user runs and scores), both engines ready, an API key set: for lm-eval (test_eval), the slow
    clients (test_slow_clients) and the drain on Ctrl-C (test_drain), which stops it and so runs
    last in their group (the `last` mark). One start for the three, on the path a user takes.
    REQUEST_TIMEOUT_S 600: admission predicts from the step times the engines measured last, and
    lm-eval's runs measure them while lm-eval's own processes share this worker's core; after them,
    at the default 120 s, the drain test's 60-token vLLM stream was once refused 429 on an idle
    engine (2026-12-03). What admission refuses is test_admission's; here it must admit."""
    env = {"API_KEY": KEY, "CLIENT_TIMEOUT_S": "600", "GRACEFUL_TIMEOUT": "120", "REQUEST_TIMEOUT_S": "600"}
    env |= {n: "auto" for n in PINNED}
    srv = MakeServe(tmp_path_factory.mktemp("serve"), env)
    try:
        srv.wait_ready(900)
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def static_server(tmp_path_factory):
    """One real gunicorn with the static engine alone (vLLM disabled, no API key), for the tests
    that fill its queue, need a disabled engine or a service without a key: test_openai's 429 the
    SDK retries and its 503, test_admission's deadline behind a backlog, the bench smoke (`bench
    --url`) and the race page that asks for no key (test_page). A queue of
    STATIC_SERVER_QUEUE sequences: admission's backlog of 8 and its one more fit even before a
    round takes any (a full queue would answer its generous request 429 queue_full), and
    test_openai fills it to the brim.
    Four rows a round (the default, named here since both tests count on it); a timeout no
    prediction on a busy machine reaches, so that a deadline alone decides; one torch thread,
    since two spinning at every op's barrier on an oversubscribed CPU made a decode step 7 s here
    against 0.3 s with one. Each test waits for what it sent and leaves nothing queued."""
    env = {
        "VLLM_ENABLED": "0",
        "MAX_QUEUE": str(STATIC_SERVER_QUEUE),
        "BATCH_SIZE": "4",
        "THREADS": "16",
        "REQUEST_TIMEOUT_S": "3600",
        "TORCH_THREADS": "1",
    }
    with serving(tmp_path_factory.mktemp("static"), env, ready=("static",), disabled=("vllm",)) as srv:
        yield srv


# --- the OpenAI SDK on the shared server, at the base URL a test's `base` names ------------------
@pytest.fixture
def sdk(shared_server, base) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=shared_server.url + base, api_key=KEY, max_retries=0, _strict_response_validation=True
    )


@pytest.fixture
def streaming_sdk(shared_server, base) -> openai.OpenAI:
    """Not strict: OpenAI's own stream chunks carry `finish_reason: null`, which the SDK's strict
    validation (written for whole replies) refuses."""
    return openai.OpenAI(base_url=shared_server.url + base, api_key=KEY, max_retries=0)
