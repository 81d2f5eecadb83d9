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
has them), torch's fp16 `F.linear` reads half of fp32's bytes and wins for the one or two rows of
a narrow decode step, but loses from three rows on, and is 4-5x slower than fp32 for a prefill's
hundreds. There each fp16 linear keeps its weight in two formats, the fp16 one for calls of fewer
than FP16_BELOW rows and a oneDNN-packed fp32 copy of the same values for wider ones (the
activation widened for the call, the product rounded back to fp16): each width reads the format
it reads fastest (issue 44). Every linear and the lm_head once (AMD EPYC Zen 4, 2 threads,
2026-12-04, ms): 1 row fp16 15.1 / packed fp32 35.8; 2 rows 28.9 / 38.3; 3 rows 36.6 / 35.8;
4 rows 47.2 / 33.3; 16 rows 141 / 36.8. In a whole round of 4 the two take the same time (1.10
against 1.08 s: the fp16 activations' other ops cost what the linears save); what the packed copy
gains is the prefill, which used to convert every weight on every call (a 4x193-token prefill 2.8
s converted, 2.3 s packed). The price: the fp32 copy (twice the fp16 weights' memory).
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


class TwoFormatLinear(torch.nn.Module):
    """An fp16 `nn.Linear` that reads its fp16 weight for calls of fewer than FP16_BELOW rows and a
    oneDNN-packed fp32 copy of it (`rows`: the batch it is packed for) for wider ones (see above)."""

    def __init__(self, linear: torch.nn.Linear, rows: int):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        wide_bias = None if linear.bias is None else linear.bias.detach().float()
        self.wide = PackedLinear(linear.weight.float(), wide_bias, rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in_features]
        if x.numel() < FP16_BELOW * self.in_features:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        return self.wide(x.float()).to(x.dtype)


def pack_linears(model: torch.nn.Module, rows: int) -> str:
    """Replace every `nn.Linear` of `model` (on the CPU) by a PackedLinear; what it did, for the
    log. Where this torch or CPU cannot pack the model's dtype (fp16 needs AVX512-FP16 or
    AVX-NE-CONVERT), fp16 linears become TwoFormatLinears and others stay as they were; the log
    says why."""
    dtype = next(model.parameters()).dtype
    if not torch.backends.mkldnn.is_available():
        log.info("static engine: no oneDNN in this torch; linears stay plain")
        return ""
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=dtype), rows)
    except RuntimeError as exc:
        widen = dtype == torch.float16
        log.info(
            "static engine: oneDNN cannot pack %s weights here (%s); linears %s",
            dtype,
            exc,
            f"read fp16 under {FP16_BELOW} rows, packed fp32 from there" if widen else "stay plain",
        )
        if not widen:
            return ""
        count = _replace_linears(model, lambda linear: TwoFormatLinear(linear, rows))
        return f"{count} fp16 linears in two formats: fp16 under {FP16_BELOW} rows, packed fp32 from there"
    count = _replace_linears(model, lambda linear: PackedLinear(linear.weight, linear.bias, rows))
    return f"{count} linears packed for oneDNN"


def _replace_linears(model: torch.nn.Module, make) -> int:
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, name, make(child))
                count += 1
    return count
