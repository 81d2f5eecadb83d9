"""The OpenAI API on both engines, driven by the official `openai` SDK against the real gunicorn.

Every test runs twice: base URL /v1 (vLLM, continuous batching) and /static/v1 (static
batching). Non-streamed replies are checked by the SDK's strict response validation, so a missing
or mistyped field fails the test.
"""

from __future__ import annotations

import threading

import httpx
import openai
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoTokenizer

from bench import serve_client
from tests.helpers import BASES, MODEL, PARIS, wait_until
from tests.helpers.servers import KEY, STATIC_SERVER_QUEUE, auth, json_auth

DEMO_ROUTE = {"/v1": "/generate_vllm", "/static/v1": "/generate"}


@pytest.fixture(scope="module")
def server(shared_server):
    return shared_server  # tests/e2e/conftest.py: the session's gunicorn, keys "other-key" and KEY, 8 prompts


@pytest.fixture(scope="module")
def tokenizer(server):
    return AutoTokenizer.from_pretrained(
        requests.get(f"{server.url}/v1/models", headers=auth()).json()["data"][0]["root"]
    )


def demo_texts(server, base, prompts, max_tokens) -> list[str]:
    r = requests.post(
        server.url + DEMO_ROUTE[base], json={"prompts": prompts, "max_tokens": max_tokens}, headers=auth(), timeout=300
    )
    assert r.status_code == 200, r.text
    return r.json()["generated_texts"]


@BASES
def test_models_lists_the_served_model(sdk):
    models = sdk.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].object == "model" and models.data[0].model_extra["max_model_len"] > 0


@BASES
def test_a_string_prompt_completes_as_on_the_demo_route_with_usage(server, sdk, base, tokenizer):
    reply = sdk.completions.create(model=MODEL, prompt=PARIS, max_tokens=8, temperature=0)
    [choice] = reply.choices
    assert choice.text == demo_texts(server, base, [PARIS], 8)[0] and choice.text.startswith(" Paris")
    assert choice.index == 0 and choice.finish_reason == "length"
    assert reply.object == "text_completion" and reply.id.startswith("cmpl-") and reply.model == MODEL
    assert reply.usage.prompt_tokens == len(tokenizer(PARIS).input_ids)
    assert reply.usage.completion_tokens == 8
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 8


@BASES
def test_a_list_of_prompts_gives_one_choice_per_prompt_in_order(server, sdk, base):
    prompts = [PARIS, "def fibonacci(n):", "Once upon a time"]
    reply = sdk.completions.create(model=MODEL, prompt=prompts, max_tokens=6, temperature=0, user="u1")
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert [c.text for c in reply.choices] == demo_texts(server, base, prompts, 6)
    assert reply.usage.completion_tokens == 3 * 6


@BASES
def test_chat_answers_through_the_models_chat_template(sdk):
    reply = sdk.chat.completions.create(
        messages=[{"role": "user", "content": "What is the capital of France?"}], model=MODEL, temperature=0
    )
    [choice] = reply.choices
    assert "Paris" in choice.message.content, choice.message.content
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    assert reply.usage.completion_tokens > 0 and reply.usage.prompt_tokens > 10  # the template's tokens too


@BASES
def test_streamed_completions_join_into_the_non_streamed_texts(sdk, streaming_sdk):
    prompts = [PARIS, "Once upon a time"]
    plain = [c.text for c in sdk.completions.create(model=MODEL, prompt=prompts, max_tokens=10, temperature=0).choices]
    chunks = list(
        streaming_sdk.completions.create(model=MODEL, prompt=prompts, max_tokens=10, temperature=0, stream=True)
    )
    joined = ["".join(c.choices[0].text for c in chunks if c.choices[0].index == i) for i in range(2)]
    assert joined == plain
    for i in range(2):
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices[0].index == i and c.choices[0].finish_reason]
        assert reasons == ["length"]
    assert len(chunks) > 6  # a chunk per decoding step, not one blob
    assert all(c.usage is None for c in chunks)  # no usage chunk unless asked


@BASES
def test_streamed_chat_carries_the_role_first_and_usage_last_when_asked(sdk, streaming_sdk):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    plain = sdk.chat.completions.create(messages=messages, model=MODEL, temperature=0, max_tokens=12)
    chunks = list(
        streaming_sdk.chat.completions.create(
            messages=messages,
            model=MODEL,
            temperature=0,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    *content, last = chunks
    assert content[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in content) == plain.choices[0].message.content
    assert [c.choices[0].finish_reason for c in content if c.choices[0].finish_reason] == [
        plain.choices[0].finish_reason
    ]
    assert last.choices == [] and last.usage.total_tokens == plain.usage.total_tokens
    assert all(c.object == "chat.completion.chunk" for c in chunks)


@BASES
def test_n_stop_logprobs_and_seed_in_openais_shapes(sdk):
    three = sdk.completions.create(model=MODEL, prompt=PARIS, max_tokens=6, temperature=0, n=3, stop=["\n"], logprobs=2)
    assert [c.index for c in three.choices] == [0, 1, 2] and len({c.text for c in three.choices}) == 1  # greedy
    first = three.choices[0]
    assert first.text == " Paris." and first.finish_reason == "stop"  # ended before the stop string
    assert "".join(first.logprobs.tokens).startswith(first.text)
    assert all(lp <= 0 for lp in first.logprobs.token_logprobs)
    assert all(len(top) == 2 for top in first.logprobs.top_logprobs)
    assert first.logprobs.text_offset[:2] == [0, len(first.logprobs.tokens[0])]

    chat = sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=5,
        logprobs=True,
        top_logprobs=3,
    )
    content = chat.choices[0].logprobs.content
    assert "".join(t.token for t in content) == chat.choices[0].message.content
    for token in content:  # greedy: the chosen token is the most likely one
        assert [t.logprob for t in token.top_logprobs] == sorted((t.logprob for t in token.top_logprobs), reverse=True)
        assert len(token.top_logprobs) == 3 and token.top_logprobs[0].token == token.token
        assert bytes(token.bytes).decode() == token.token

    def seeded(seed: int) -> str:
        return sdk.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=16, seed=seed).choices[0].text

    assert seeded(7) == seeded(7) != seeded(8)  # temperature 1 (OpenAI's default), drawn per seed


@BASES
def test_usage_counts_each_prompt_once_whatever_n(sdk, streaming_sdk, tokenizer):
    prompts = [PARIS, "Once upon a time"]
    prompt_tokens = sum(len(tokenizer(p).input_ids) for p in prompts)
    asked = {"model": MODEL, "prompt": prompts, "max_tokens": 2, "n": 3, "extra_body": {"ignore_eos": True}}
    reply = sdk.completions.create(**asked)
    assert len(reply.choices) == 6 and reply.usage.completion_tokens == 6 * 2
    assert reply.usage.prompt_tokens == prompt_tokens  # as vLLM counts: a prompt once, not n times
    assert reply.usage.total_tokens == prompt_tokens + 6 * 2
    *_, last = streaming_sdk.completions.create(**asked, stream=True, stream_options={"include_usage": True})
    assert last.usage.prompt_tokens == prompt_tokens and last.usage.completion_tokens == 6 * 2
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    one, two = (sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, n=n) for n in (1, 2))
    assert len(two.choices) == 2 and two.usage.prompt_tokens == one.usage.prompt_tokens > 10


@BASES
def test_errors_arrive_as_the_sdks_exception_classes(sdk):
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.completions.create(model=MODEL, prompt=PARIS, max_tokens=0)
    assert bad.value.body["param"] == "max_tokens" and bad.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.completions.create(model=MODEL, prompt=PARIS, stream_options={"include_usage": True})
    assert bad.value.body["param"] == "stream_options"
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": 3}])
    assert bad.value.body["param"] == "messages"
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.completions.create(model="gpt-4", prompt=PARIS)
    assert missing.value.body["code"] == "model_not_found"
    with pytest.raises(openai.APIStatusError) as too_many:
        sdk.completions.create(model=MODEL, prompt=["a"] * 9, max_tokens=1)
    assert too_many.value.status_code == 413 and too_many.value.body["code"] == "too_many_prompts"


@BASES
def test_invalid_json_is_a_400_in_openais_shape(server, base):
    r = requests.post(f"{server.url}{base}/completions", data="{nope", headers=json_auth(), timeout=30)
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "message": "request body is not valid JSON",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_json",
        }
    }


@BASES
def test_the_api_key_is_required_on_every_generate_route(server, base):
    wrong = openai.OpenAI(base_url=server.url + base, api_key="wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        wrong.completions.create(model=MODEL, prompt=PARIS, max_tokens=1)
    assert refused.value.body["code"] == "invalid_api_key"
    none = requests.post(f"{server.url}{base}/completions", json={"prompt": PARIS, "max_tokens": 1}, timeout=30)
    assert none.status_code == 401 and none.json()["error"]["type"] == "authentication_error"
    demo = requests.post(server.url + DEMO_ROUTE[base], json={"prompts": ["Hi"], "max_tokens": 1}, timeout=30)
    assert demo.status_code == 401 and demo.json()["type"] == "invalid_api_key"
    assert requests.get(f"{server.url}/health", timeout=30).status_code == 200  # open
    assert requests.get(f"{server.url}/metrics", timeout=30).status_code == 200
    ok = openai.OpenAI(base_url=server.url + base, api_key="other-key").completions.create(
        model=MODEL, prompt=PARIS, max_tokens=1
    )
    assert len(ok.choices) == 1


def test_openai_requests_are_counted_and_logged_like_the_others(server):
    # its own requests: the server is shared and the suite runs in a random order, so the counts
    # must grow by these and the log must say them after this test began
    mark, before = server.log_mark(), requests.get(f"{server.url}/metrics", timeout=30).text
    done = requests.post(
        f"{server.url}/v1/completions", json={"prompt": PARIS, "max_tokens": 1}, headers=auth(), timeout=300
    )
    chat = requests.post(
        f"{server.url}/static/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
        headers=auth(),
        timeout=300,
    )
    plain = requests.post(
        f"{server.url}/static/v1/completions", json={"prompt": PARIS, "max_tokens": 1}, headers=auth(), timeout=300
    )
    assert [done.status_code, chat.status_code, plain.status_code] == [200, 200, 200]
    metrics = requests.get(f"{server.url}/metrics", timeout=30).text
    for endpoint, n in (("/v1/completions", 1), ("/static/v1/chat/completions", 1), ("/static/v1/completions", 1)):
        labels = {"endpoint": endpoint, "status": "200"}
        assert latency_count(metrics, labels) == latency_count(before, labels) + n, endpoint
    assert "POST /static/v1/completions 200" in server.log_text(since=mark)


def latency_count(metrics: str, labels: dict) -> float:
    """request_latency_seconds_count{labels} in a /metrics text; 0 where it has no sample yet."""
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "request_latency_seconds_count" and sample.labels == labels:
                return sample.value
    return 0


@BASES
def test_vllms_benchmark_client_runs_without_a_failed_request(server, base, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    root = requests.get(f"{server.url}/v1/models", headers=auth(), timeout=30).json()["data"][0]["root"]
    engine = "vllm" if base == "/v1" else "static"
    result = serve_client.run(server.url, engine, root, MODEL, num_prompts=8, input_len=32, output_len=4)
    assert result["completed"] == 8 and result["failed"] == 0


def test_the_sdk_retries_a_429_by_itself(static_server):
    background = openai.OpenAI(base_url=f"{static_server.url}/static/v1", api_key="-", max_retries=0, timeout=900)
    answered = []

    def fire(prompts, tokens):
        reply = background.completions.create(
            model=MODEL, prompt=prompts, max_tokens=tokens, extra_body={"ignore_eos": True}
        )
        answered.append(len(reply.choices))

    # a long round of four runs, then as many more prompts as the queue holds fill it
    long_round = threading.Thread(target=fire, args=(["Tell me a story"] * 4, 40))
    long_round.start()
    engine = static_server.engine
    wait_until(
        lambda: engine("static").get("inflight") == 4 and engine("static").get("queued") == 0,
        60,
        "the long round to run",
    )
    fill = [f"Fill {i}" for i in range(STATIC_SERVER_QUEUE)]
    queued = threading.Thread(target=fire, args=(fill, 2))
    queued.start()
    wait_until(lambda: engine("static").get("queued") == STATIC_SERVER_QUEUE, 60, "the queue to fill")

    statuses = []
    client = openai.OpenAI(
        base_url=f"{static_server.url}/static/v1",
        api_key="-",
        max_retries=300,  # Retry-After is 1 s: the long round has minutes to finish, even on a busy machine
        http_client=httpx.Client(event_hooks={"response": [lambda r: statuses.append(r.status_code)]}),
    )
    reply = client.completions.create(model=MODEL, prompt=PARIS, max_tokens=2)
    long_round.join(300)
    queued.join(300)
    assert statuses[0] == 429 and statuses[-1] == 200 and set(statuses) == {429, 200}
    # the requests that filled it, answered
    assert len(reply.choices) == 1 and sorted(answered) == [4, STATIC_SERVER_QUEUE]


def test_a_disabled_engine_answers_503_as_the_sdks_exception(static_server):
    client = openai.OpenAI(base_url=f"{static_server.url}/v1", api_key="-", max_retries=0)
    with pytest.raises(openai.InternalServerError) as down:
        client.models.list()
    assert down.value.status_code == 503 and down.value.body["code"] == "engine_unavailable"
    assert "VLLM_ENABLED" in down.value.body["message"]
