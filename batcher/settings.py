"""Each engine's slice of the service's settings, with every `auto` already resolved.

`service.config.Config` builds them (`Config.static_engine`, `Config.vllm_engine`), once, from
the environment's values and the machine (batcher/device.py): the engines and the runner take
them through their constructors and hold no defaults of their own. Frozen: nothing changes a
setting after start, and /health shows them as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from batcher.compile_cache import kernel_dir

# The static engine's dtype that reads the GGUF's own blocks (Q4_0, Q4_1, Q8_0) with fp32
# activations and arithmetic (batcher/static/blocks.py); a dtype of the profile's rows too
BLOCKS = "blocks"


@dataclass(frozen=True)
class StaticSettings:
    model_path: str  # what from_pretrained loads
    device: str  # cpu | cuda (DEVICE resolved)
    dtype: str  # bfloat16 | float16 | float32 | blocks (DTYPE and STATIC_WEIGHTS resolved on `device`)
    compile: bool  # STATIC_COMPILE resolved: a compiled decode step over a static KV cache
    reason: str  # why dtype and compile are what they are (batcher/device.py: the profile's row)
    batch_size: int  # also the compiled rounds' fixed batch
    batch_wait_ms: float
    max_queue: int
    max_input_tokens: int
    max_tokens_limit: int  # the largest max_tokens a request may ask for (MAX_NEW_TOKENS_LIMIT)
    torch_threads: int  # 0: every core the process may use
    stall_s: float  # ENGINE_STALL_S: holding work with no progress this long fails the engine
    # (width, seconds a token) the machine profile measured for this dtype and decoding: the cost
    # model's prior (batcher/width_clock.py); () without a profile
    profile_step_s: tuple[tuple[int, float], ...] = ()
    # where the blocks' kernels are built (once per machine, torch and source) and loaded from
    kernel_dir: str = kernel_dir("")
    prefix_cache: bool = False  # STATIC_PREFIX_CACHE: a one-row round's cache kept (static/prefix.py)

    def shown(self) -> dict:
        """What /health shows: the resolved choices, not the paths or sizes."""
        return {"device": self.device, "dtype": self.dtype, "compile": self.compile, "reason": self.reason}


@dataclass(frozen=True)
class VLLMSettings:
    model_path: str
    enabled: bool
    device: str  # where vLLM's platform runs: the machine's (DEVICE is the static engine's)
    dtype: str  # DTYPE resolved on `device`
    enforce_eager: bool  # VLLM_ENFORCE_EAGER resolved
    reason: str  # why dtype and enforce_eager are what they are
    max_num_seqs: int
    max_model_len: int
    max_input_tokens: int
    kv_cache_gib: float  # CPU only: the KV cache, resident from the start (kv_cache_bytes)
    gpu_memory_utilization: float  # GPU only
    max_inbox: int
    tensor_parallel_size: int
    stall_s: float  # ENGINE_STALL_S
    profile_step_s: tuple[tuple[int, float], ...] = ()  # as StaticSettings'
    kernel_dir: str = kernel_dir("")  # as StaticSettings': with dtype "blocks", where its kernels are

    @property
    def kv_cache_bytes(self) -> int:
        return int(self.kv_cache_gib * 2**30)

    def shown(self) -> dict:
        shown = ("device", "dtype", "enforce_eager", "reason")
        return {name: getattr(self, name) for name in shown}

    def engine_args(self) -> dict:
        """vLLM's EngineArgs for these settings: the service's engine (batcher/vllm/worker.py) and
        the profile's candidates (`vllm.LLM`, batcher/profile/child.py) take the same, so that the
        profile measures the engine the service runs. Left to their defaults they differ:
        `vllm.LLM` batches 4,096 tokens a step on CPU, the engine 2,048, and their structured-output
        backends differ, so their configs hash apart (one compile-cache key each)."""
        from vllm.config import SchedulerConfig

        from batcher.grammar import vllm_config

        names = (
            "max_num_seqs",
            "max_model_len",
            "gpu_memory_utilization",
            "enforce_eager",
            "tensor_parallel_size",
        )
        return {
            "model": self.model_path,
            **self._weights(),
            **{name: getattr(self, name) for name in names},
            "max_num_batched_tokens": SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS,  # the engine's own default
            "disable_log_stats": True,
            "structured_outputs_config": vllm_config(),  # the static engine's xgrammar settings
            # on a CPU the KV cache is sized in bytes (VLLM_CPU_KVCACHE_SPACE, whole GiB, still wins
            # if set); on a GPU gpu_memory_utilization sizes it
            **({"kv_cache_memory_bytes": self.kv_cache_bytes} if self.device == "cpu" else {}),
        }

    def _weights(self) -> dict:
        """dtype, and with "blocks" the GGUF's blocks read in fp32 (batcher/vllm/blocks.py: our
        method, made known to vLLM here, before the engine that names it is built)."""
        if self.dtype != BLOCKS:
            return {"dtype": self.dtype}
        from batcher.checkpoint import gguf_source
        from batcher.vllm import blocks

        if self.device != "cpu":
            raise ValueError("VLLM_WEIGHTS=blocks: the GGUF's blocks are read by CPU kernels; vLLM runs on a GPU here")
        source = gguf_source(self.model_path)
        if source is None:
            raise ValueError(f"{self.model_path} was not converted from a GGUF file: it has no blocks to read")
        blocks.register()
        config = blocks.quantization_config(source, self.kernel_dir)
        return {"dtype": "float32", "quantization": blocks.NAME, "hf_overrides": {"quantization_config": config}}
