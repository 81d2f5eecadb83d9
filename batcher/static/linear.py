"""The static engine's linear layers on a CPU: oneDNN, with each weight packed once at load.

Why not plain `nn.Linear`: on a CPU, torch's fp32 `F.linear` runs MKL's sgemm, which for the few
rows a decode step has (one per sequence of the round) reads the weights at a fraction of the
memory's speed, and a decode step is little else than reading every weight once. oneDNN's
matmul, handed weights reordered once into its own layout, reads them about twice as fast. It is
what torch's own compiler emits for a CPU linear when it freezes weights (Inductor's
fx_passes/mkldnn_fusion.py: `mkldnn._reorder_linear_weight`, then `mkldnn._linear_pointwise`)
and what vLLM's CPU backend runs (`create_onednn_mm`); here without compiling anything.
Measured (AMD EPYC Zen 4, one thread, fp32, greedy tokens unchanged, 2026-12-03): a decode step
of a 4-row round 101-107 ms plain, 73-76 ms packed; of an 8-row round 153 against 82 ms; a
4x190-token prefill 2.1 against 1.7 s; bf16 4 rows 98 against 72 ms.
Where oneDNN cannot pack fp16 (it needs AVX512-FP16 or AVX-NE-CONVERT; neither Zen 3 nor Zen 4
has them), fp16 means fp16 *weights* computed in fp32 (`half_weights`, issue 44): the model is
loaded in fp32, every parameter rounded to fp16's values, and each linear keeps those values in two
formats: fp16 for calls of fewer than FP16_BELOW rows (torch's fp16 kernel reads half of fp32's
bytes: a one-row decode step) and packed fp32 for wider ones (a round of 4, a prefill). Every
other op runs in fp32, where this CPU has no fp16 arithmetic to spare. Every linear and the
lm_head once (AMD EPYC Zen 4, 2 threads, 2026-12-04, ms, fp16 / packed fp32): 1 row 15.1 / 35.8;
2 rows 28.9 / 38.3; 3 rows 36.6 / 35.8; 4 rows 47.2 / 33.3; 16 rows 141 / 36.8. Whole rounds of 20
tokens, interleaved, same machine: one row 0.70 s (fp16 throughout: 0.69, fp32: 1.13), four rows
1.38 s (fp16 throughout 1.52, fp32 1.30); greedy tokens the same as fp32's on those prompts.
Before, fp16 ran throughout, its calls of 8 rows and more converting the weight to fp32 on every
call. The price: the fp32 copy (the model takes fp32's memory and half of it again).
Compiled decoding (STATIC_COMPILE) keeps plain linears: Inductor picks its own kernels.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)
FP16_BELOW = 3  # rows of one fp16 linear call (tokens of the round) under which it reads fp16 weights


class PackedLinear(torch.nn.Module):
    """`nn.Linear`'s forward on a weight [out, in] packed for oneDNN (`rows`: the batch it is packed for)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, rows: int):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows)
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in_features]
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
    return f"{count} linears packed for oneDNN"


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
