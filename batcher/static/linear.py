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
Compiled decoding (STATIC_COMPILE) keeps plain linears: Inductor picks its own kernels.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


class PackedLinear(torch.nn.Module):
    """`nn.Linear`'s forward on a weight packed for oneDNN (`rows`: the batch it is packed for)."""

    def __init__(self, linear: torch.nn.Linear, rows: int):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), rows)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in_features]
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def pack_linears(model: torch.nn.Module, rows: int) -> int:
    """Replace every `nn.Linear` of `model` (on the CPU) by a PackedLinear; how many. 0 where
    this torch or CPU cannot pack the model's dtype (fp16 needs AVX512-FP16 or AVX-NE-CONVERT):
    the model is then left as it was, and the log says why."""
    dtype = next(model.parameters()).dtype
    if not torch.backends.mkldnn.is_available():
        log.info("static engine: no oneDNN in this torch; linears stay plain")
        return 0
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=dtype), rows)
    except RuntimeError as exc:
        log.info("static engine: oneDNN cannot pack %s weights here (%s); linears stay plain", dtype, exc)
        return 0
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, name, PackedLinear(child, rows))
                count += 1
    return count
