"""VLLM_WEIGHTS=blocks: the vLLM engine's linears read the GGUF's own blocks in fp32
(batcher/vllm/blocks.py), on a tiny llama written to a GGUF file (tests/helpers/tiny_gguf.py:
layer 0 in Q4_0, layer 1 in Q4_1, the tied head on the embeddings' Q8_0). Each engine in a
process of its own (tests/helpers/vllm_tokens.py), as the profile runs its candidates."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from tests.helpers.workers import PROMPTS

HELPER = "tests.helpers.vllm_tokens"
PINNED = {"vllm_enforce_eager": "1", "vllm_max_num_seqs": 4, "vllm_kv_cache_gib": 0.05}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """The tiny model's GGUF file converted into a checkpoint, as the service does."""
    from batcher.checkpoint import gguf_path, resolve_model
    from tests.helpers.tiny_gguf import write

    folder = tmp_path_factory.mktemp("tiny")
    return resolve_model(str(write(folder / "tiny.gguf", gguf_path())), folder / "models")


def engine(model_path: str, **config) -> dict:
    from service.config import Config

    settings = Config(**PINNED, **config).vllm_engine(model_path)
    command = [sys.executable, "-m", HELPER, json.dumps(dataclasses.asdict(settings)), json.dumps(PROMPTS[:3])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "stays dense" not in done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_linear_reads_its_blocks_in_place_of_its_weight_and_the_tokens_are_fp32s(tiny):
    dense = engine(tiny, dtype="float32", vllm_weights="dense")
    blocks = engine(tiny, vllm_weights="blocks")
    assert (dense["dtype"], blocks["dtype"]) == ("float32", "blocks") and dense["blocks"] == {}
    stacked = {f"model.layers.{n}.{name}" for n in (0, 1) for name in ("self_attn.qkv_proj", "self_attn.o_proj")}
    stacked |= {f"model.layers.{n}.{name}" for n in (0, 1) for name in ("mlp.gate_up_proj", "mlp.down_proj")}
    assert set(blocks["blocks"]) == stacked | {"lm_head"}
    assert all(blocks["blocks"][name] == 0 for name in stacked)  # one copy: the blocks
    assert blocks["blocks"]["lm_head"] > 0  # tied: the embeddings' table stays, for the lookups
    assert blocks["tokens"] == dense["tokens"]


def test_blocks_need_a_model_converted_from_a_gguf_file(model_path, tmp_path):
    """The default model is converted from the shipped GGUF; a plain checkpoint folder is not."""
    from service.config import Config

    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("config.json", "model.safetensors"):
        (plain / name).symlink_to(f"{model_path}/{name}")
    settings = Config(vllm_weights="blocks", profile_dir=str(tmp_path)).vllm_engine(str(plain))
    with pytest.raises(ValueError, match="was not converted from a GGUF file"):
        settings.engine_args()
