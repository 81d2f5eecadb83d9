"""Which of the GGUF's blocks each of vLLM's layers reads (batcher/vllm/blocks.py's `stacked`):
vLLM stacks q, k and v into one `qkv_proj` and gate and up into one `gate_up_proj`; a layer reads
blocks only where the file holds every part, all of one kind."""

from types import SimpleNamespace

from batcher.vllm.blocks import stacked

LAYER = "model.layers.3"


def found(**kinds) -> dict:
    return {f"{LAYER}.{name.replace('__', '.')}": SimpleNamespace(kind=kind) for name, kind in kinds.items()}


def test_stacked_layers_take_their_parts_in_vllms_row_order():
    file = found(self_attn__q_proj="q4_1", self_attn__k_proj="q4_1", self_attn__v_proj="q4_1")
    file |= found(mlp__gate_proj="q4_0", mlp__up_proj="q4_0", mlp__down_proj="q8_0")
    file["lm_head"] = SimpleNamespace(kind="q8_0")
    qkv = stacked(f"{LAYER}.self_attn.qkv_proj", file)
    assert qkv == [file[f"{LAYER}.self_attn.{p}_proj"] for p in "qkv"]
    assert stacked(f"{LAYER}.mlp.gate_up_proj", file) == [file[f"{LAYER}.mlp.gate_proj"], file[f"{LAYER}.mlp.up_proj"]]
    assert stacked(f"{LAYER}.mlp.down_proj", file) == [file[f"{LAYER}.mlp.down_proj"]]
    assert stacked("lm_head", file) == [file["lm_head"]]


def test_a_layer_with_a_part_missing_or_of_another_kind_stays_dense():
    file = found(self_attn__q_proj="q4_1", self_attn__k_proj="q4_0", self_attn__v_proj="q4_1")
    assert stacked(f"{LAYER}.self_attn.qkv_proj", file) is None  # mixed kinds
    del file[f"{LAYER}.self_attn.k_proj"]
    assert stacked(f"{LAYER}.self_attn.qkv_proj", file) is None  # k dense in the file
    assert stacked(f"{LAYER}.self_attn.o_proj", file) is None
    assert stacked("model.embed_tokens", file) is None
