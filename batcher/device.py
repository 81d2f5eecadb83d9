"""Which device and dtype a model runs on, and whether it compiles: each `auto` resolved per
machine, here and nowhere else (service/config.py asks, for both engines and the bench).

On a CPU the answer is the machine profile's (batcher/profile: what `make setup` measured here,
faithful first, then fastest); without a profile for this machine, fp32 eager. On a GPU (not
profiled: none measured yet) the rules stand: bf16 where supported, else fp16, compiled.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from batcher.profile import choose, prior, store
from batcher.settings import BLOCKS


@dataclass(frozen=True)
class Picked:
    dtype: str  # bfloat16 | float16 | float32
    eager: bool  # False: compiled (STATIC_COMPILE=1, VLLM_ENFORCE_EAGER=0)
    reason: str  # the measured row, or why there is none; shown in /health and the start log
    # (width, seconds a token) the profile measured for this dtype and decoding: the engine's cost
    # model starts from it (batcher/profile/prior.py); () without one
    step_s: tuple[tuple[int, float], ...] = ()


def pick_device(device: str) -> str:
    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def switch(value: str) -> bool | None:
    """An `auto | 0 | 1` knob (Config validates the spelling): None for auto."""
    return None if value == "auto" else value == "1"


def pick(
    engine: str,
    dtype: str,
    eager: bool | None,
    device: str,
    model_path: str,
    profile_dir: str,
    dense_only=False,
    budget_mib: float | None = None,
    beside=None,
) -> Picked:
    """`engine`'s dtype and decoding on `device`: DTYPE ("auto" or a name) and its eager knob
    (None: auto) as set; every auto from this machine's profile under `profile_dir`; `dense_only`
    (STATIC_WEIGHTS or VLLM_WEIGHTS dense): no row that reads the GGUF's blocks; `budget_mib` (MEMORY_BUDGET_GIB)
    the worker's memory, shared with the other engine's row `beside` (choose.room)."""
    if device.startswith("cuda"):
        gpu_dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        picked = (gpu_dtype if dtype == "auto" else dtype, False if eager is None else eager)
        return Picked(*picked, "GPU: bf16 where supported, else fp16; compiled (GPUs are not profiled)")
    profile = store.load(store.machine_key(model_path), profile_dir) if os.path.isdir(model_path) else None
    if profile is not None and dense_only:
        profile = {**profile, "rows": [row for row in profile["rows"] if row["dtype"] != BLOCKS]}
    room = None if profile is None or budget_mib is None else choose.room(profile, engine, budget_mib, beside)
    dtype, eager, reason = choose.resolve(profile, engine, dtype, eager, room)
    return Picked(dtype, eager, reason, prior.step_seconds(profile, engine, dtype, eager))


def openmp_runtime() -> str:
    """Which OpenMP this process's parallel loops run on: "intel" where Intel's libiomp5 was
    preloaded (`make serve`'s PRELOAD), "gnu" otherwise (torch's own libgomp). GNU's stops
    spinning at its barriers once a process holds more OpenMP threads than cores (vLLM's pool
    beside the static engine's), so a static round sleeps and wakes at each one (what that costs:
    docs/performance.md#the-graphs-stored-whole-loaded-without-tracing)."""
    with open("/proc/self/maps") as maps:
        return "intel" if "libiomp5" in maps.read() else "gnu"
