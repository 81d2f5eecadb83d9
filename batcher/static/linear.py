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
has them), torch's fp16 `F.linear` falls back to a kernel that is fine for the one to four rows of
a decode step (it reads half of fp32's bytes) and 4-5x slower than fp32 for a prefill's hundreds.
There each fp16 linear widens a call of WIDEN_FROM rows or more to fp32: the weight converted for
that call, the product in fp32, rounded back to fp16; as close to fp32 as torch's fp16 kernel
(docs/performance.md). Same Zen 4, one thread, 2026-12-03: a 4x193-token prefill 10.9-11.1 s
plain, 2.8 s widened (fp32 packed: 2.3 s); a forward of 8 tokens 189 against 174 ms, of 4 tokens
102 against 185 ms (hence 8).
Compiled decoding (STATIC_COMPILE) keeps plain linears: Inductor picks its own kernels.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)
WIDEN_FROM = 8  # rows of one fp16 linear call (tokens of the round) from which it computes in fp32


class PackedLinear(torch.nn.Module):
    """`nn.Linear`'s forward on a weight packed for oneDNN (`rows`: the batch it is packed for)."""

    def __init__(self, linear: torch.nn.Linear, rows: int):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), rows)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in_features]
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


class WidenedLinear(torch.nn.Module):
    """An fp16 `nn.Linear` that computes a call of WIDEN_FROM rows or more in fp32 (see above)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in_features]
        if x.numel() < WIDEN_FROM * self.in_features:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        bias = None if self.bias is None else self.bias.float()
        return torch.nn.functional.linear(x.float(), self.weight.float(), bias).to(x.dtype)


def pack_linears(model: torch.nn.Module, rows: int) -> str:
    """Replace every `nn.Linear` of `model` (on the CPU) by a PackedLinear; what it did, for the
    log. Where this torch or CPU cannot pack the model's dtype (fp16 needs AVX512-FP16 or
    AVX-NE-CONVERT), fp16 linears become WidenedLinears and others stay as they were; the log
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
            f"compute calls of {WIDEN_FROM}+ rows in fp32" if widen else "stay plain",
        )
        if not widen:
            return ""
        count = _replace_linears(model, WidenedLinear)
        return f"{count} fp16 linears widened to fp32 from {WIDEN_FROM} rows"
    count = _replace_linears(model, lambda linear: PackedLinear(linear, rows))
    return f"{count} linears packed for oneDNN"


def _replace_linears(model: torch.nn.Module, make) -> int:
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, name, make(child))
                count += 1
    return count
