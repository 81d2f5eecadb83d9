"""The static engine's linear layers on a CPU: oneDNN, with each weight packed once at load.

Why not plain `nn.Linear`: torch's fp32 `F.linear` runs MKL's sgemm, which for a decode step's few
rows reads the weights at a fraction of the memory's speed, and a decode step is little else.
oneDNN's matmul on weights reordered once into its own layout reads them about twice as fast; it
is what Inductor emits for a frozen CPU linear (`mkldnn._reorder_linear_weight`, then
`mkldnn._linear_pointwise`) and what vLLM's CPU backend runs (`create_onednn_mm`), here without
compiling anything. Where oneDNN cannot pack fp16 (it needs AVX512-FP16 or AVX-NE-CONVERT), fp16
means fp16 *weights* computed in fp32 (`half_weights`): every parameter rounded to fp16's values,
read as fp16 by calls of fewer than FP16_BELOW rows (half the bytes) and packed in fp32 by wider
ones; every other op runs in fp32. The price: the fp32 copy (fp32's memory and half of it again).
Compiled decoding (STATIC_COMPILE) runs the same layers: its graphs call the packed linear as an
operator (`packed_linear`) with the packed weight as an input, so the weights stay one copy, held
by the model, and a graph holds code alone (batcher/static/graphs.py stores and loads it).
Figures: docs/performance.md#the-static-engines-decode-where-a-step-goes, and #per-cpu-kind's Zen 4.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)
FP16_BELOW = 3  # rows of one fp16 linear call (tokens of the round) under which it reads fp16 weights


@torch.library.custom_op("llm_static::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """oneDNN's linear on a packed weight, as an operator a graph calls: Inductor lowers the
    oneDNN call itself only for a weight it froze into the graph as a constant."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@packed_linear.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], out_features)


class PackedLinear(torch.nn.Module):
    """`nn.Linear`'s forward on a weight [out, in] packed for oneDNN (`rows`: the batch it is packed for)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, rows: int):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows)
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in_features]
        if torch.compiler.is_dynamo_compiling():  # traced: the operator; eager: the call alone, without its dispatch
            return packed_linear(x, self.packed, self.bias, self.out_features)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


class HalfWeightLinear(torch.nn.Module):
    """A linear of an fp32 model whose weights hold fp16 values: a call of fewer than FP16_BELOW
    rows reads them as fp16 (the activation rounded for the call, the product widened back), a
    wider one reads the same values packed in fp32 (`rows`: the batch it is packed for)."""

    def __init__(self, linear: torch.nn.Linear, rows: int):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight.detach().half()
        self.bias = None if linear.bias is None else linear.bias.detach().half()
        self.wide = PackedLinear(linear.weight, linear.bias, rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in_features], fp32
        if x.numel() < FP16_BELOW * self.in_features:
            return torch.nn.functional.linear(x.half(), self.weight, self.bias).float()
        return self.wide(x)


def packs(dtype: torch.dtype, rows: int = 4) -> str | None:
    """None where oneDNN packs `dtype` weights in this torch on this CPU, else why not."""
    if not torch.backends.mkldnn.is_available():
        return "no oneDNN in this torch"
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=dtype), rows)
    except RuntimeError as exc:
        return str(exc).splitlines()[0]
    return None


def pack_linears(model: torch.nn.Module, rows: int) -> str:
    """Replace every `nn.Linear` of `model` (on the CPU) by a PackedLinear; what it did, for the
    log. Where this torch or CPU cannot pack the model's dtype, they stay as they were; the log
    says why."""
    dtype = next(model.parameters()).dtype
    why = packs(dtype, rows)
    if why is not None:
        log.info("static engine: oneDNN cannot pack %s weights here (%s); linears stay plain", dtype, why)
        return ""
    count = _replace_linears(model, lambda linear: PackedLinear(linear.weight, linear.bias, rows))
    return f"{count} linears packed for oneDNN" if count else ""  # none left: all read as blocks


def half_weights(model: torch.nn.Module, rows: int) -> str:
    """fp16 weights computed in fp32 (see above): round every parameter of the fp32 `model` to
    fp16's values, and make every `nn.Linear` a HalfWeightLinear; what it did, for the log."""
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.half().float())
    count = _replace_linears(model, lambda linear: HalfWeightLinear(linear, rows))
    return f"fp16 weights computed in fp32: {count} linears read fp16 under {FP16_BELOW} rows, packed fp32 from there"


def _replace_linears(model: torch.nn.Module, make) -> int:
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, name, make(child))
                count += 1
    return count
