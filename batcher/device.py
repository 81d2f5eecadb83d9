"""Which device and dtype a model runs on: `auto` resolved per machine, for both engines and the bench."""

from __future__ import annotations

import torch


def pick_device(device: str) -> str:
    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def pick_dtype(dtype: str, device: str) -> torch.dtype:
    """bf16 where the hardware computes it natively, else fp16 on a GPU, fp32 on a CPU."""
    if dtype != "auto":
        return getattr(torch, dtype)
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    native_bf16 = torch.backends.cpu.get_cpu_capability() in ("AVX512", "AVX512_BF16") and (
        torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    )
    return torch.bfloat16 if native_bf16 else torch.float32
