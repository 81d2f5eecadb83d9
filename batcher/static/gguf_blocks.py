"""The model's own bytes: a GGUF file's quantized blocks, found for each linear of the model built
from it, as they are in the file (never quantized again).

A llama GGUF names its tensors `blk.N.attn_q.weight` and so on; transformers' model names the
same linears `model.layers.N.self_attn.q_proj`. Each tensor of a block type (Q4_0, Q4_1, Q8_0)
is a matrix [out, in] stored row after row, every row in blocks of 32 inputs, so a row of blocks
is a row of the weight. llama.cpp's converter permuted the rows of q and k (for its rope), and
transformers undoes that when it reads the file (`LlamaTensorProcessor._reverse_permute_weights`);
so do we, on whole rows of bytes. The tied head reads the embeddings' blocks.

Which blocks belong to which linear is checked, never assumed: `attach` dequantizes each and
compares it with the weight the model loaded, value for value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

# ggml block types the static engine reads as blocks: (bytes a block, inputs a block)
BLOCK_TYPES = {"Q4_0": (18, 32), "Q4_1": (20, 32), "Q8_0": (34, 32)}
_LLAMA = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


@dataclass(frozen=True)
class Blocks:
    """One weight matrix [out_features, in_features] as the file holds it."""

    kind: str  # "q4_0" | "q4_1" | "q8_0"
    data: torch.Tensor  # uint8 [out_features, in_features / 32 * bytes a block], rows of blocks
    out_features: int
    in_features: int


def read(path: str | Path) -> tuple[dict[str, Blocks], dict[str, str]]:
    """The blocks of every linear of the llama model in the GGUF at `path`, by transformers'
    module name ("model.layers.0.self_attn.q_proj", "lm_head"), and {module: why not} for the
    linears whose tensors are of no block type here (F16, K-quants...): they stay dense."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        return {}, {"*": f"architecture {arch!r}: only llama's tensor names are mapped"}
    heads = int(_field(reader, "llama.attention.head_count"))
    kv_heads = int(_field(reader, "llama.attention.head_count_kv") or heads)
    found, dense, tensors = {}, {}, {t.name: t for t in reader.tensors}
    for name, tensor in tensors.items():
        match = _LAYER.fullmatch(name)
        if name == "token_embd.weight" and "output.weight" not in tensors:
            module = "lm_head"  # tied: the head reads the embeddings
        elif name == "output.weight":
            module = "lm_head"
        elif match and match[2] in _LLAMA:
            module = f"model.layers.{match[1]}.{_LLAMA[match[2]]}"
        else:
            continue
        kind = tensor.tensor_type.name
        if kind not in BLOCK_TYPES:
            dense[module] = f"{kind} (no block kernel for it)"
            continue
        in_features, out_features = (int(n) for n in tensor.shape)  # ggml lists the fastest dimension first
        rows = np.array(tensor.data, dtype=np.uint8).reshape(out_features, -1)  # a copy, out of the memory map
        if match and match[2] in ("attn_q", "attn_k"):
            rows = _unpermute(rows, heads if match[2] == "attn_q" else kv_heads)
        found[module] = Blocks(kind.lower(), torch.from_numpy(rows), out_features, in_features)
    return found, dense


def _unpermute(rows: np.ndarray, heads: int) -> np.ndarray:
    """transformers' `_reverse_permute_weights` on whole rows (of bytes, here)."""
    half = rows.shape[0] // heads // 2
    return rows.reshape(heads, half, 2, rows.shape[1]).swapaxes(2, 1).reshape(rows.shape).copy()


def _field(reader, key: str):
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def use_blocks(model: torch.nn.Module, model_path: str, kernel_dir: str) -> str:
    """`attach` the blocks of the GGUF that `model_path` was converted from, the kernels loaded
    from `kernel_dir` (built there by `make setup`: a second; else built now, or the fallback)."""
    from batcher.checkpoint import gguf_source
    from batcher.static import blocks

    source = gguf_source(model_path)
    if source is None:
        raise ValueError(f"{model_path} was not converted from a GGUF file: it has no blocks to read")
    blocks.use_kernels(blocks.build(kernel_dir))
    return attach(model, source)


def attach(model: torch.nn.Module, path: str | Path) -> str:
    """Make every linear of `model` (fp32, loaded from the checkpoint converted from the GGUF at
    `path`) whose blocks the file holds read those blocks (batcher/static/blocks.py's
    BlockLinear), once each is shown to dequantize to exactly the weight the model loaded; the
    dense weight is dropped. A tied head's blocks serve the embeddings' lookup too (BlockEmbedding),
    so the dense table goes as well. What it did, for the log.
    Raises ValueError naming the first linear whose blocks differ: such a file is not this model's."""
    from batcher.static.blocks import BlockEmbedding, BlockLinear

    found, dense = read(path)
    modules = dict(model.named_modules())
    kinds: dict[str, int] = {}
    for name, blocks in found.items():
        linear = modules.get(name)
        if type(linear) is not torch.nn.Linear:
            raise ValueError(f"{path}: {name} is no linear of this model")
        if not _same(blocks, linear.weight):
            raise ValueError(f"{path}: the blocks of {name} are not the weights the model loaded")
        parent, _, child = name.rpartition(".")
        bias = None if linear.bias is None else linear.bias.detach().float()
        block_linear = BlockLinear(blocks.kind, blocks.data, blocks.out_features, blocks.in_features, bias)
        setattr(modules[parent] if parent else model, child, block_linear)
        kinds[blocks.kind] = kinds.get(blocks.kind, 0) + 1
    if not kinds:
        raise ValueError(f"{path}: no linear of this model is stored in blocks ({dense or 'none found'})")
    if getattr(model.config, "tie_word_embeddings", False) and "lm_head" in found:
        # tied: the embeddings' lookup reads the head's blocks too (one copy, the dense table dropped)
        model.set_input_embeddings(BlockEmbedding(model.lm_head))
        model.config.tie_word_embeddings = False  # nothing may tie them again: both read the blocks
    with torch.no_grad():  # what stays dense (norms) may view the checkpoint's memory map, which
        for param in model.parameters():  # would keep every page of the file resident: own copies
            param.data = param.data.clone()
    read_as = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))
    return f"linears read as the GGUF's blocks in fp32: {read_as}" + (f"; dense: {len(dense)}" if dense else "")


def _same(blocks: Blocks, weight: torch.Tensor, rows: int = 2048) -> bool:
    """The blocks dequantize to exactly `weight`: compared a slice of rows at a time, so that the
    check leaves no large fp32 copy for the allocator to keep (tcmalloc holds on to freed memory)."""
    from batcher.static.blocks import dequantize

    if tuple(weight.shape) != (blocks.out_features, blocks.in_features):
        return False
    for start in range(0, blocks.out_features, rows):
        part = blocks.data[start : start + rows]
        if not torch.equal(
            dequantize(blocks.kind, part, part.shape[0], blocks.in_features), weight[start : start + rows]
        ):
            return False
    return True
