"""The request models' sampling parameters (`to_sampling_params`, the rules across fields) and the
stop-string helpers: pure functions, no model."""

import pytest

from batcher.sampling import SamplingParams
from batcher.static.stops import find_stop, held_back
from service.config import Config
from service.errors import InvalidRequest
from service.openai.chat.protocol import Chat
from service.protocol import validate
from service.protocol.sampling import Sampling

CONFIG = Config()


MESSAGES = [{"role": "user", "content": "hi"}]


def parse(body) -> SamplingParams:
    return validate(Sampling, body, CONFIG).to_sampling_params(CONFIG)


def parse_n(body, config) -> int:
    return validate(Sampling, body, config).n or 1


def chat(body) -> SamplingParams:
    return validate(Chat, {"messages": MESSAGES, **body}, CONFIG).to_sampling_params(CONFIG)


def test_an_empty_body_gives_the_neutral_defaults():
    assert parse({}) == SamplingParams(max_tokens=CONFIG.max_new_tokens)
    assert chat({}).temperature == 1.0  # the OpenAI routes' default
    assert parse_n({}, CONFIG) == 1


def test_every_field_is_read():
    body = {
        "stop": "\n",
        "stop_token_ids": [2, 2, 5],
        "seed": 7,
        "logprobs": 3,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "repetition_penalty": 1.2,
        "top_k": 40,
        "min_p": 0.05,
        "min_tokens": 3,
        "logit_bias": {"50": 5, "7": -100},
    }
    p = parse(body)
    assert p.stop == ("\n",) and p.stop_token_ids == (2, 5) and p.seed == 7 and p.logprobs == 3
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.5, -0.5, 1.2)
    assert (p.top_k, p.min_p, p.min_tokens) == (40, 0.05, 3)
    assert p.logit_bias == ((7, -100.0), (50, 5.0))
    assert parse({"stop": ["a", "bc"]}).stop == ("a", "bc")
    assert parse_n({"n": 8}, CONFIG) == 8


@pytest.mark.parametrize(
    "body, param",
    [
        ({"stop": ""}, "stop"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": [1]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"stop_token_ids": "2"}, "stop_token_ids"),
        ({"seed": 1.5}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"logprobs": 6}, "logprobs"),
        ({"logprobs": True}, "logprobs"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 1.0}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"min_tokens": 21}, "min_tokens"),  # more than max_tokens (20 by default)
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": [5]}, "logit_bias"),
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
def test_bad_values_name_their_parameter(body, param):
    with pytest.raises(InvalidRequest) as caught:
        parse(body)
    assert caught.value.param == param and param in str(caught.value)


@pytest.mark.parametrize("n", [0, 9, "2", 2.0, True])
def test_n_lies_in_1_to_max_n(n):
    with pytest.raises(InvalidRequest) as caught:
        parse_n({"n": n}, CONFIG)
    assert caught.value.param == "n"


def test_find_stop_takes_the_earliest_ending_stop_string_after_the_searched_text():
    assert find_stop("hello world", ("wor", "lo"), 0) == 3
    assert find_stop("hello world", ("wor",), 8) == 6  # ends after 8: found
    assert find_stop("hello world", ("hel",), 5) is None  # ended before 5: searched already
    assert find_stop("abc", ("x",), 0) is None


def test_held_back_keeps_the_longest_tail_that_may_start_a_stop_string():
    assert held_back("The end is ne", ("near", "the end")) == 2
    assert held_back("The end is ne", ()) == 0
    assert held_back("The end", ("end.",)) == 3
    assert held_back("abc", ("xyz",)) == 0


def test_chat_logprobs_map_onto_the_one_logprobs_field():
    assert chat({"logprobs": True, "top_logprobs": 2}).logprobs == 2
    assert chat({"logprobs": True}).logprobs == 0
    assert chat({"logprobs": False}).logprobs is None
    assert chat({}).logprobs is None
    for body, param in (({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": 3}, "logprobs")):
        with pytest.raises(InvalidRequest) as caught:
            chat(body)
        assert caught.value.param == param
    with pytest.raises(InvalidRequest):
        chat({"logprobs": True, "top_logprobs": 6})


def test_chat_max_completion_tokens_wins():
    assert chat({"max_tokens": 5, "max_completion_tokens": 7}).max_tokens == 7
    assert chat({"max_tokens": 5}).max_tokens == 5
    assert chat({}).max_tokens == CONFIG.max_new_tokens


@pytest.mark.parametrize(
    "body, param",
    [
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": True, "stream_options": {"continuous_usage_stats": True}}, "stream_options"),
        ({"stream": True, "details": True}, "details"),
        ({"stream": True, "prompt_logprobs": 1}, "prompt_logprobs"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"messages": [{"role": "user", "tool_calls": []}]}, "messages"),
        ({"messages": [{"role": "tool", "content": "3"}]}, "messages"),
        ({"messages": [{"role": "user"}]}, "messages"),
    ],
)
def test_rules_across_fields_are_the_models_and_name_the_field(body, param):
    """Checked once, as the body is validated: no view or helper checks them again."""
    with pytest.raises(InvalidRequest) as caught:
        chat(body)
    assert caught.value.param == param, caught.value
