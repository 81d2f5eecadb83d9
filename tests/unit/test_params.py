"""The sampling-parameter parser and the stop-string helpers: pure functions, no model."""

import pytest

from batcher.sampling import SamplingParams
from batcher.static.stops import find_stop, held_back
from service.config import Config
from service.errors import InvalidRequest
from service.params import chat_logprobs, parse_n, parse_sampling

CONFIG = Config()


def parse(body, temperature=0.0):
    return parse_sampling(body, CONFIG, default_temperature=temperature)


def test_an_empty_body_gives_the_neutral_defaults():
    assert parse({}) == SamplingParams(max_tokens=CONFIG.max_new_tokens)
    assert parse({}, temperature=1.0).temperature == 1.0  # the OpenAI routes' default
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
    assert parse(chat_logprobs({"logprobs": True, "top_logprobs": 2})).logprobs == 2
    assert parse(chat_logprobs({"logprobs": True})).logprobs == 0
    assert parse(chat_logprobs({"logprobs": False})).logprobs is None
    assert parse(chat_logprobs({})).logprobs is None
    for body, param in (({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": 3}, "logprobs")):
        with pytest.raises(InvalidRequest) as caught:
            chat_logprobs(body)
        assert caught.value.param == param
    with pytest.raises(InvalidRequest):
        chat_logprobs({"logprobs": True, "top_logprobs": 6})
