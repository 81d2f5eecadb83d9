"""How many batch lines the runner keeps in an engine at once (service/jobs/runner.py
`batch_width`): a round's worth while interactive work runs there or ran within QUIET_S, and on
vLLM half its slots once it has been quiet that long."""

import math

import pytest

from service.config import Config
from service.jobs.runner import QUIET_S, batch_width


@pytest.mark.parametrize("quiet_s", [0.0, QUIET_S / 2, QUIET_S, math.inf])
def test_the_static_engine_takes_a_round_whatever_the_interactive_work(quiet_s):
    assert batch_width("static", Config(batch_size=4, vllm_max_num_seqs=64), quiet_s=quiet_s) == 4


@pytest.mark.parametrize("quiet_s", [0.0, QUIET_S / 2])
def test_vllm_takes_a_round_while_interactive_work_runs_or_has_just_run(quiet_s):
    assert batch_width("vllm", Config(batch_size=4, vllm_max_num_seqs=64), quiet_s=quiet_s) == 4


@pytest.mark.parametrize("quiet_s", [QUIET_S, math.inf])
def test_vllm_takes_half_its_slots_once_quiet(quiet_s):
    assert batch_width("vllm", Config(batch_size=4, vllm_max_num_seqs=64), quiet_s=quiet_s) == 32


def test_the_busy_width_never_exceeds_the_quiet_one():
    config = Config(batch_size=8, vllm_max_num_seqs=6)
    assert batch_width("vllm", config, quiet_s=0.0) == batch_width("vllm", config, quiet_s=math.inf) == 3
    assert batch_width("vllm", Config(batch_size=4, vllm_max_num_seqs=1), quiet_s=math.inf) == 1
