"""Which device and dtype a model runs on, and whether it compiles: each `auto` resolved per
machine, here and nowhere else (service/config.py asks, for both engines and the bench)."""

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


def dtype_name(dtype: torch.dtype) -> str:
    """torch.float32 -> "float32": the spelling DTYPE, vLLM and /health use."""
    return str(dtype).removeprefix("torch.")


def _switch(value: str, auto: bool) -> bool:
    """An `auto | 0 | 1` knob (Config validates the spelling): auto takes the machine's answer."""
    return auto if value == "auto" else value == "1"


def pick_compile(value: str, device: str) -> bool:
    """STATIC_COMPILE: auto compiles on a GPU only. On this project's CPU the compiled decode step
    was 1.19x faster on a round of 4 (20 tokens), short of the 1.25x that pays for ~100 s of
    compile per batch size (README, *Compiled static decoding*)."""
    return _switch(value, device.startswith("cuda"))


def pick_enforce_eager(value: str, device: str) -> bool:
    """VLLM_ENFORCE_EAGER: auto is eager on CPU (there the compiled bf16 model answered further
    from fp32 and started slower, for ~15% more decode speed; see README), compiled on GPU."""
    return _switch(value, device == "cpu")
