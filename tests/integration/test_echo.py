"""What an evaluation harness sends to /completions (lm-eval's `local-completions`: token-id
prompts, `echo`, `logprobs`, a tiny `max_tokens`) and vLLM's `prompt_logprobs`, on both engines,
through the real app (both engines in one process, float32): the shapes vLLM 0.32 answers, and
the numbers the model gives when run directly."""

from __future__ import annotations

import json

import pytest
import torch

from service.http.state import app_state
from tests.helpers import BASES, PARIS
from tests.helpers.apps import enqueued

STORY = "Once upon a time, in a small village,"
# fp32 on both engines and directly: the same model's numbers, to rounding
TOLERANCE = 1e-3


@pytest.fixture
def post(vllm_client):
    def post(base: str, route: str = "completions", **body):
        return vllm_client.post(f"{base}/{route}", json={"temperature": 0, **body})

    return post


@pytest.fixture(scope="module")
def tokenizer(vllm_app):
    return app_state(vllm_app).tokenizer


def ok(reply) -> dict:
    assert reply.status_code == 200, reply.json
    return reply.json


@BASES
def test_echo_starts_the_text_with_the_prompt(post, base):
    plain = ok(post(base, prompt=PARIS, max_tokens=5))["choices"][0]["text"]
    echoed = ok(post(base, prompt=PARIS, max_tokens=5, echo=True))["choices"][0]
    assert echoed["text"] == PARIS + plain and plain
    assert echoed["logprobs"] is None and "prompt_logprobs" not in echoed


@BASES
def test_echo_with_logprobs_puts_the_prompts_tokens_first(post, base, tokenizer):
    ids = tokenizer(PARIS).input_ids
    plain = ok(post(base, prompt=PARIS, max_tokens=3, logprobs=2))["choices"][0]
    choice = ok(post(base, prompt=PARIS, max_tokens=3, logprobs=2, echo=True))["choices"][0]
    lp = choice["logprobs"]
    assert lp["tokens"][: len(ids)] == [tokenizer.decode([t]) for t in ids]
    assert lp["tokens"][len(ids) :] == plain["logprobs"]["tokens"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # nothing predicts the first
    assert all(x <= 0 for x in lp["token_logprobs"][1:])
    assert all(len(top) == 2 for top in lp["top_logprobs"][1:])
    assert "".join(lp["tokens"]) == choice["text"] == PARIS + plain["text"]
    assert lp["text_offset"][0] == 0 and lp["text_offset"][len(ids)] == len(PARIS)
    # the generated tokens' numbers are those of the plain request
    generated = lp["token_logprobs"][len(ids) :]
    assert generated == pytest.approx(plain["logprobs"]["token_logprobs"], abs=1e-5)
    # and the prompt's are the prompt logprob records the choice carries too, as vLLM's
    records = choice["prompt_logprobs"]
    assert records[0] is None and len(records) == len(ids)
    for token, logprob, entry in zip(ids[1:], lp["token_logprobs"][1 : len(ids)], records[1:], strict=True):
        assert entry[str(token)]["logprob"] == logprob


@BASES
def test_a_generated_eos_is_the_last_record_as_lm_eval_reads_it(post, base, tokenizer):
    """lm-eval scores a continuation as token_logprobs[ctxlen:-1]: the one generated token must
    be last, also when it is EOS (no text). This prompt's next token, greedy, is EOS."""
    prompt = "Question: What is the square root of 81?\nAnswer: 9"
    ids = tokenizer(prompt).input_ids
    reply = ok(post(base, prompt=prompt, max_tokens=1, logprobs=1, echo=True, temperature=0))
    [choice] = reply["choices"]
    assert choice["finish_reason"] == "stop" and choice["text"] == prompt  # EOS adds no text
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(ids) + 1 and lp["tokens"][-1] == tokenizer.decode([tokenizer.eos_token_id])
    assert lp["tokens"][:-1] == [tokenizer.decode([t]) for t in ids]  # the whole prompt is scored
    assert reply["usage"]["completion_tokens"] == 1  # generated and counted, as vLLM counts it


@BASES
def test_a_token_id_prompt_completes_as_its_text_and_echoes_its_decoded_text(post, base, tokenizer):
    ids = tokenizer(PARIS).input_ids
    as_text = ok(post(base, prompt=PARIS, max_tokens=5))
    as_ids = ok(post(base, prompt=ids, max_tokens=5))
    assert as_ids["choices"][0]["text"] == as_text["choices"][0]["text"]
    assert as_ids["usage"] == as_text["usage"]
    echoed = ok(post(base, prompt=ids, max_tokens=5, echo=True))["choices"][0]["text"]
    assert echoed == tokenizer.decode(ids) + as_text["choices"][0]["text"]


@BASES
def test_a_list_of_token_id_lists_is_one_choice_per_list(post, base, tokenizer):
    prompts = [PARIS, STORY]
    lists = [tokenizer(p).input_ids for p in prompts]
    texts = [c["text"] for c in ok(post(base, prompt=prompts, max_tokens=4))["choices"]]
    reply = ok(post(base, prompt=lists, max_tokens=4, echo=True, logprobs=0))
    assert [c["text"] for c in reply["choices"]] == [p + t for p, t in zip(prompts, texts, strict=True)]
    for choice, ids in zip(reply["choices"], lists, strict=True):
        assert choice["logprobs"]["token_logprobs"][0] is None
        assert len(choice["logprobs"]["tokens"]) == len(ids) + 4 or choice["finish_reason"] == "stop"


@BASES
def test_max_tokens_0_with_echo_returns_the_prompt_alone(post, base, tokenizer):
    ids = tokenizer(STORY).input_ids
    choice = ok(post(base, prompt=STORY, max_tokens=0, echo=True))["choices"][0]
    assert choice["text"] == STORY
    scored = ok(post(base, prompt=[ids], max_tokens=0, echo=True, logprobs=1))["choices"][0]
    assert scored["text"] == STORY and len(scored["logprobs"]["tokens"]) == len(ids)
    assert scored["logprobs"]["token_logprobs"][0] is None
    refused = post(base, prompt=STORY, max_tokens=0)  # vLLM: 0 only with echo
    assert refused.status_code == 400 and refused.json["error"]["param"] == "max_tokens"


@BASES
def test_a_streamed_echo_sends_the_prompt_first(vllm_client, post, base):
    whole = ok(post(base, prompt=[PARIS, STORY], max_tokens=6, echo=True, logprobs=1))
    reply = vllm_client.post(
        f"{base}/completions",
        json={"prompt": [PARIS, STORY], "max_tokens": 6, "echo": True, "logprobs": 1, "temperature": 0, "stream": True},
    )
    events = [line[6:] for line in reply.get_data(as_text=True).splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
    for index, prompt in enumerate([PARIS, STORY]):
        mine = [c for c in chunks if c["index"] == index]
        assert mine[0]["text"].startswith(prompt)
        assert "".join(c["text"] for c in mine) == whole["choices"][index]["text"]
        tokens = [t for c in mine for t in c["logprobs"]["tokens"]]
        assert tokens == whole["choices"][index]["logprobs"]["tokens"]


@BASES
def test_prompt_logprobs_in_vllms_shape(post, base, tokenizer):
    ids = tokenizer(STORY).input_ids
    choice = ok(post(base, prompt=STORY, max_tokens=2, prompt_logprobs=3))["choices"][0]
    assert choice["text"] and not choice["text"].startswith(STORY) and choice["logprobs"] is None
    records = choice["prompt_logprobs"]
    assert records[0] is None and len(records) == len(ids)
    for token, entry in zip(ids[1:], records[1:], strict=True):
        assert 3 <= len(entry) <= 4  # the prompt's token, and the top 3
        mine = entry[str(token)]
        assert mine["decoded_token"] == tokenizer.decode([token]) and mine["rank"] >= 1
        ranked = sorted(entry.values(), key=lambda e: e["rank"])
        assert [e["rank"] for e in ranked][:3] == [1, 2, 3]
        assert ranked[0]["logprob"] >= ranked[1]["logprob"] >= ranked[2]["logprob"] >= -9999


@BASES
def test_prompt_logprobs_on_chat_and_chats_echo(post, base):
    messages = [{"role": "user", "content": "Name a colour."}]
    reply = ok(post(base, "chat/completions", messages=messages, max_tokens=3, prompt_logprobs=0))
    assert reply["prompt_logprobs"][0] is None and len(reply["prompt_logprobs"]) == reply["usage"]["prompt_tokens"]
    assert all(len(entry) == 1 for entry in reply["prompt_logprobs"][1:])  # the token itself, no alternatives
    plain = ok(post(base, "chat/completions", messages=messages, max_tokens=3))
    assert "prompt_logprobs" not in plain
    started = [*messages, {"role": "assistant", "content": "My answer:"}]
    echoed = ok(post(base, "chat/completions", messages=started, max_tokens=3, echo=True))
    assert echoed["choices"][0]["message"]["content"].startswith("My answer:")
    users = ok(post(base, "chat/completions", messages=messages, max_tokens=3, echo=True))
    assert users["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]


@BASES
@pytest.mark.parametrize(
    ("prompt", "why"),
    [
        ([], "empty"),
        ([[]], "an empty list of token ids"),
        ([[1, 2], []], "an empty list of token ids"),
        ([1, "a"], "token ids are integers"),
        ([[1, 2], "a"], "token ids are integers"),
        ([-1, 2], "token ids are integers"),
        ([True, 2], "token ids are integers"),
        ([1.5], "token ids are integers"),
        ([5, 99999999], "outside 0..49151"),
        ([[5], [49152]], "outside 0..49151"),
        ({"ids": [1]}, "must be a string"),
    ],
)
def test_a_bad_prompt_is_a_400_naming_it_and_nothing_runs(vllm_app, post, base, prompt, why):
    before = enqueued(vllm_app)  # the session's app: what earlier tests left may still be running
    reply = post(base, prompt=prompt, max_tokens=2, echo=True)
    assert reply.status_code == 400, reply.json
    assert reply.json["error"]["param"] == "prompt" and why in reply.json["error"]["message"], reply.json
    assert enqueued(vllm_app) == before  # nothing reached an engine
    assert all(engine.status == "ready" for engine in app_state(vllm_app).engines.values())


@BASES
def test_prompt_logprobs_out_of_range_or_streamed_is_a_400(post, base):
    for body in ({"prompt_logprobs": 6}, {"prompt_logprobs": -1}, {"prompt_logprobs": 1, "stream": True}):
        reply = post(base, prompt=PARIS, max_tokens=2, **body)
        assert reply.status_code == 400 and reply.json["error"]["param"] == "prompt_logprobs", (body, reply.json)


def test_both_engines_score_a_prompt_as_the_model_run_directly(post, tokenizer, runner_fp32):
    """In float32 the engines' prompt logprobs (through echo, as lm-eval reads them) agree with
    each other and with a plain forward of the model, to TOLERANCE."""
    ids = tokenizer(STORY + " there lived an old clockmaker who").input_ids
    with torch.inference_mode():
        logits = runner_fp32.model(torch.tensor([ids])).logits[0].float()
    direct = logits[:-1].log_softmax(dim=-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()
    served = {}
    for base in ("/v1", "/static/v1"):
        # with a longer prompt beside it: on the static engine, one round, this one left-padded
        longer = tokenizer(STORY * 3).input_ids
        choice = ok(post(base, prompt=[ids, longer], max_tokens=1, echo=True, logprobs=1))["choices"][0]
        served[base] = choice["logprobs"]["token_logprobs"][1 : len(ids)]
    gaps = {base: max(abs(a - b) for a, b in zip(lps, direct, strict=True)) for base, lps in served.items()}
    between = max(abs(a - b) for a, b in zip(served["/v1"], served["/static/v1"], strict=True))
    print(f"max |logprob gap|: vs direct {gaps}, between engines {between:.2e}")
    assert max(gaps.values()) < TOLERANCE and between < TOLERANCE, (gaps, between)
