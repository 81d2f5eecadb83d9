"""Linear layers that read a GGUF file's quantized blocks as they are (Q4_1, Q4_0, Q8_0), in fp32.

A decode step reads every weight once, so its time is the bytes it reads: a Q4_1 block holds 32
weights in 20 bytes where fp32 needs 128. The kernels (kernels/blocks.cpp) unpack each block in
registers and compute in fp32; they are built once per machine, torch and source, under a key in
DEFAULT_KERNEL_DIR, and loaded at every later start. They are torch operators
(`torch.ops.llm_blocks.q4_1_linear` ...), so torch.compile traces a model that calls them and its
graphs call them back, the blocks passed in as inputs (one copy, nothing folded into the graph).
Where they cannot build (no compiler), the same layer dequantizes its blocks with torch ops and
calls `F.linear`: the same answer, to fp32's rounding, at a fraction of the speed.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F

from batcher.compile_cache import kernel_dir
from batcher.static.kernels import SOURCE, digest

log = logging.getLogger(__name__)
DEFAULT_KERNEL_DIR = kernel_dir("")  # under COMPILE_CACHE_DIR's default
QK = 32  # weights a block, along the input dimension
BLOCK_BYTES = {"q4_1": 20, "q4_0": 18, "q8_0": 34}

_kernels: ModuleType | None = None  # the built extension every BlockLinear calls; None: the torch fallback
_traceable = False  # the operators' output shapes registered for tracing (once a process)
_loaded: ModuleType | None = None  # the extension as this process loaded it: its operators are process-wide


def build(folder: str | Path = DEFAULT_KERNEL_DIR) -> ModuleType | None:
    """The kernels, compiled into `folder`/<torch version>-<source hash> the first time (about a
    minute) and loaded from there later (seconds); None, with the reason logged, where they
    cannot be built here. Once loaded, the same module for every later call, whatever `folder`: a
    second copy of the library would register its operators again, which aborts the process."""
    global _loaded
    if _loaded is not None:
        return _loaded
    directory = Path(folder) / re.sub(r"[^\w.-]", "_", f"torch-{torch.__version__}-{digest()}")
    try:
        from torch.utils.cpp_extension import load

        directory.mkdir(parents=True, exist_ok=True)
        module = load(
            name="blocks_kernels",
            sources=[str(SOURCE)],
            # without -fopenmp, at::parallel_for compiles to a plain loop: one thread, whatever torch's count
            extra_cflags=["-O3", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            build_directory=str(directory),
            verbose=False,
        )
    except Exception as error:  # a compiler's failure has many types; every one means "use the fallback"
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        log.warning("block kernels not built in %s, using torch's dequantize + F.linear: %s", directory, reason)
        return None
    _register_shapes()
    _loaded = module
    return module


def op(kind: str):
    """The built kernel of `kind` (q4_1, q4_0, q8_0): (x [M, K] fp32, blocks uint8 [N, K/32 * bytes
    a block], N, K) -> [M, N] fp32."""
    return getattr(torch.ops.llm_blocks, f"{kind}_linear")


def _register_shapes() -> None:
    """What each operator returns, for tracing (torch.compile runs them on shapes, not values)."""
    global _traceable
    if not _traceable:
        for kind in BLOCK_BYTES:
            torch.library.register_fake(f"llm_blocks::{kind}_linear")(lambda x, w, N, K: x.new_empty(x.shape[0], N))
        _traceable = True


def use_kernels(module: ModuleType | None) -> None:
    """Set the kernels every BlockLinear calls (None: the torch fallback); once, at load."""
    global _kernels
    _kernels = module


def dequantize(kind: str, w: torch.Tensor, N: int, K: int) -> torch.Tensor:
    """The fp32 matrix [N, K] that the blocks `w` (uint8 [N, K/32 * bytes a block]) hold, with
    torch ops only: the tests' reference and the fallback's weights."""
    if kind not in BLOCK_BYTES:
        raise ValueError(f"unknown block kind {kind!r}: one of {sorted(BLOCK_BYTES)}")
    blocks = w.reshape(N, K // QK, BLOCK_BYTES[kind])

    def half(start: int) -> torch.Tensor:  # the fp16 at byte `start` of each block: [N, K/32, 1]
        return blocks[..., start : start + 2].contiguous().view(torch.float16).float()

    if kind == "q8_0":
        codes = blocks[..., 2:].contiguous().view(torch.int8).float()
        return (half(0) * codes).reshape(N, K)
    nibbles = blocks[..., 4:] if kind == "q4_1" else blocks[..., 2:]
    codes = torch.cat([nibbles & 0xF, nibbles >> 4], dim=-1).float()  # weights j, then j + 16
    if kind == "q4_0":
        return (half(0) * (codes - 8)).reshape(N, K)
    return (half(0) * codes + half(2)).reshape(N, K)


class BlockLinear(torch.nn.Module):
    """`nn.Linear`'s forward on a weight [out_features, in_features] held as GGUF blocks."""

    def __init__(
        self, kind: str, blocks: torch.Tensor, out_features: int, in_features: int, bias: torch.Tensor | None = None
    ):
        super().__init__()
        if kind not in BLOCK_BYTES:
            raise ValueError(f"unknown block kind {kind!r}: one of {sorted(BLOCK_BYTES)}")
        if in_features % QK:
            raise ValueError(f"in_features {in_features} is no multiple of {QK}")
        shape = (out_features, in_features // QK * BLOCK_BYTES[kind])
        if blocks.dtype != torch.uint8 or tuple(blocks.shape) != shape:
            raise ValueError(f"{kind} blocks must be uint8 {list(shape)}, got {blocks.dtype} {list(blocks.shape)}")
        self.kind, self.out_features, self.in_features = kind, out_features, in_features
        self.register_buffer("blocks", blocks.contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in_features], fp32
        rows = x.reshape(-1, self.in_features).contiguous()  # [M, K]
        if _kernels is not None:
            y = op(self.kind)(rows, self.blocks, self.out_features, self.in_features)
        else:
            y = F.linear(rows, dequantize(self.kind, self.blocks, self.out_features, self.in_features))
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{self.kind}, in_features={self.in_features}, out_features={self.out_features}"


class BlockEmbedding(torch.nn.Module):
    """`nn.Embedding`'s lookup from a tied head's blocks (one copy for both): each looked-up row
    dequantized with torch ops, the same values as the dense table's (the checkpoint's)."""

    def __init__(self, head: BlockLinear):
        super().__init__()
        self.head = [head]  # not a submodule: the model holds it once, as its lm_head
        self.embedding_dim = head.in_features

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # ids: [...] -> [..., embedding_dim]
        head = self.head[0]
        rows = head.blocks[ids.reshape(-1)]
        return dequantize(head.kind, rows, rows.shape[0], head.in_features).reshape(*ids.shape, -1)


def main() -> int:
    """`make setup`'s step: the kernels built under COMPILE_CACHE_DIR (as the service reads it)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    folder = kernel_dir(os.environ.get("COMPILE_CACHE_DIR", ""))
    built = build(folder)
    print(f"block kernels: {f'built in {folder}, {built.isa()}' if built else 'not built: the torch fallback'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
