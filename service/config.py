"""Settings, read from the environment once, validated once, passed down through constructors."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

from batcher.checkpoint import CHECKPOINT_NAME, DEFAULT_CACHE_DIR, DEFAULT_MODEL
from batcher.compile_cache import DEFAULT_COMPILE_CACHE_DIR
from batcher.profile.store import DEFAULT_PROFILE_DIR
from batcher.settings import StaticSettings, VLLMSettings

# VLLMSettings fields that are the Config field `vllm_<name>` as it is
VLLM_AS_SET = (
    "max_num_seqs",
    "max_model_len",
    "kv_cache_gib",
    "gpu_memory_utilization",
    "max_inbox",
    "tensor_parallel_size",
)


# Threads a generate request never takes (MAX_INFLIGHT_REQUESTS' default is THREADS less these):
# they answer /health, /metrics and the 429s past the cap. The GIL runs those answers one at a
# time, so more threads would not drain a flood faster; a few spare ones cover clients that send
# a body slowly (gunicorn gives one 5 s before it lets go of the thread) while a probe still
# finds one free.
PROBE_THREADS = 8


def _flag(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Config:
    # model
    model: str = DEFAULT_MODEL  # "smollm2", a Hugging Face model id or a local folder
    # auto: from the machine profile (`make setup` measures it; batcher/profile), per engine:
    # faithful first, then fastest; fp32 eager where this machine has no profile
    dtype: str = "auto"  # auto | bfloat16 | float16 | float32
    device: str = "auto"  # auto | cpu | cuda
    cache_dir: str = DEFAULT_CACHE_DIR
    profile_dir: str = DEFAULT_PROFILE_DIR  # the machine profiles (one JSON per machine key)
    served_model_name: str = ""  # the id in /v1/models; "": the model folder's name (or MODEL itself)
    # API_KEY: one key or several, comma-separated; when set, the generate routes want
    # "Authorization: Bearer <key>" (unset: open, for localhost)
    api_key: str = field(default="", repr=False)
    # CHAT_TEMPLATE: a Jinja chat template file that replaces the model's own (vLLM's --chat-template)
    chat_template: str = ""
    compile_cache_dir: str = DEFAULT_COMPILE_CACHE_DIR  # vLLM's and Inductor's compile caches; "" = theirs
    # static batching
    batch_size: int = 4
    batch_wait_ms: float = 0.0
    max_queue: int = 256
    max_input_tokens: int = 512
    max_new_tokens: int = 20  # default for a request that names no max_tokens
    max_new_tokens_limit: int = 512  # largest max_tokens a request may ask for
    max_prompts_per_request: int = 256
    max_n: int = 8  # largest n (completions per prompt) a request may ask for
    max_body_bytes: int = 1 << 20
    request_timeout_s: float = 120.0
    # an engine that holds work and makes no progress (no token, no finished round or step) for
    # this long is failed: /health 503, its requests 503, and the process leaves (crash-only)
    engine_stall_s: float = 300.0
    # xgrammar's cache of compiled grammars, per process (vLLM caps its own at 512 MB)
    grammar_cache_mb: int = 512
    # gunicorn's gthread threads (gunicorn.conf.py reads this field): a request holds one while
    # it is served, a generate request until its reply or stream ends
    threads: int = 128
    # generate requests (every route that runs prompts) served at once; past it, 429 `too_busy` at
    # once (service/http/inflight.py). 0: THREADS - PROBE_THREADS, the threads left for /health, /metrics
    # and the refusals themselves
    max_inflight_requests: int = 0
    # a small process of its own answers /health, /livez and /metrics on this port from what the
    # worker publishes (deploy/probe.py), never behind the worker's GIL: point the orchestrator's
    # probes and the scrapes here. 0: none (the worker's own routes still answer)
    probe_port: int = 0
    torch_threads: int = 0  # 0: every core the process may use
    # auto: from the profile on a CPU (fp32 eager without one); compiled on a GPU
    static_compile: str = "auto"  # auto | 0 | 1
    # continuous batching (vLLM)
    vllm_enabled: bool = True
    vllm_max_num_seqs: int = 64
    vllm_max_model_len: int = 2048
    vllm_kv_cache_gib: int = 1  # CPU only: VLLM_CPU_KVCACHE_SPACE, whole GiB
    vllm_gpu_memory_utilization: float = 0.5  # GPU only
    vllm_max_inbox: int = 256
    # auto: from the profile on a CPU (eager without one); compiled on a GPU
    vllm_enforce_eager: str = "auto"  # auto | 0 | 1
    vllm_tensor_parallel_size: int = 1  # GPUs one vLLM engine spans (a model larger than one GPU)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"BATCH_SIZE must be >= 1, got {self.batch_size}")
        if self.batch_wait_ms < 0:
            raise ValueError(f"BATCH_WAIT_MS must be >= 0, got {self.batch_wait_ms}")
        if self.max_queue < 1:
            raise ValueError(f"MAX_QUEUE must be >= 1, got {self.max_queue}")
        if not 1 <= self.max_new_tokens <= self.max_new_tokens_limit:
            raise ValueError("MAX_NEW_TOKENS must lie in 1..MAX_NEW_TOKENS_LIMIT")
        if self.max_n < 1:
            raise ValueError(f"MAX_N must be >= 1, got {self.max_n}")
        if self.max_input_tokens < 1 or self.max_prompts_per_request < 1:
            raise ValueError("MAX_INPUT_TOKENS and MAX_PROMPTS_PER_REQUEST must be >= 1")
        if self.request_timeout_s <= 0:
            raise ValueError(f"REQUEST_TIMEOUT_S must be > 0, got {self.request_timeout_s}")
        if self.engine_stall_s <= 0:
            raise ValueError(f"ENGINE_STALL_S must be > 0, got {self.engine_stall_s}")
        if self.grammar_cache_mb < 1:
            raise ValueError(f"GRAMMAR_CACHE_MB must be >= 1, got {self.grammar_cache_mb}")
        if not 0 < self.inflight_limit < self.threads:  # 0 is the default: THREADS - PROBE_THREADS
            raise ValueError(
                f"MAX_INFLIGHT_REQUESTS must lie in 1..THREADS - 1, got {self.inflight_limit} (THREADS {self.threads})"
            )
        if not 0 <= self.probe_port <= 65535:
            raise ValueError(f"PROBE_PORT must lie in 0..65535, got {self.probe_port}")
        if self.vllm_tensor_parallel_size < 1:
            raise ValueError(f"VLLM_TENSOR_PARALLEL_SIZE must be >= 1, got {self.vllm_tensor_parallel_size}")
        if self.dtype not in ("auto", "bfloat16", "float16", "float32"):
            raise ValueError(f"DTYPE must be auto, bfloat16, float16 or float32, got {self.dtype!r}")
        if self.static_compile not in ("auto", "0", "1"):
            raise ValueError(f"STATIC_COMPILE must be auto, 0 or 1, got {self.static_compile!r}")
        if self.vllm_enforce_eager not in ("auto", "0", "1"):
            raise ValueError(f"VLLM_ENFORCE_EAGER must be auto, 0 or 1, got {self.vllm_enforce_eager!r}")
        if self.chat_template and not os.path.isfile(self.chat_template):
            raise ValueError(f"CHAT_TEMPLATE must be a file, got {self.chat_template!r}")
        if self.max_input_tokens + self.max_new_tokens_limit > self.vllm_max_model_len:
            raise ValueError("MAX_INPUT_TOKENS + MAX_NEW_TOKENS_LIMIT must fit in VLLM_MAX_MODEL_LEN")

    @property
    def model_name(self) -> str:
        """What the OpenAI routes call the model: SERVED_MODEL_NAME, else the folder's name."""
        if self.served_model_name:
            return self.served_model_name
        if self.model == DEFAULT_MODEL:
            return CHECKPOINT_NAME
        return os.path.basename(os.path.normpath(self.model)) if os.path.isdir(self.model) else self.model

    @property
    def max_model_len(self) -> int:
        """The longest sequence a request can make (prompts keep their last MAX_INPUT_TOKENS), as
        /v1/models and /tokenize report it."""
        return self.max_input_tokens + self.max_new_tokens_limit

    @property
    def api_keys(self) -> list[str]:
        return [key.strip() for key in self.api_key.split(",") if key.strip()]

    @property
    def inflight_limit(self) -> int:
        """MAX_INFLIGHT_REQUESTS, or THREADS less the threads kept for the probes."""
        return self.max_inflight_requests or self.threads - PROBE_THREADS

    # --- each engine's slice, every auto resolved (batcher/device.py; imported here, not at the
    # top, because it imports torch and deploy/ and the gunicorn master read Config without it)
    def static_engine(self, model_path: str) -> StaticSettings:
        from batcher.device import pick, pick_device, switch

        device = pick_device(self.device)
        compiles = switch(self.static_compile)
        eager = None if compiles is None else not compiles
        picked = pick("static", self.dtype, eager, device, model_path, self.profile_dir)
        return StaticSettings(
            model_path=model_path,
            device=device,
            dtype=picked.dtype,
            compile=not picked.eager,
            reason=picked.reason,
            batch_size=self.batch_size,
            batch_wait_ms=self.batch_wait_ms,
            max_queue=self.max_queue,
            max_input_tokens=self.max_input_tokens,
            max_new_tokens=self.max_new_tokens_limit,
            torch_threads=self.torch_threads,
            stall_s=self.engine_stall_s,
        )

    def vllm_engine(self, model_path: str) -> VLLMSettings:
        from batcher.device import pick, pick_device, switch

        device = pick_device("auto")  # vLLM picks its own platform; DEVICE is the static engine's
        picked = pick("vllm", self.dtype, switch(self.vllm_enforce_eager), device, model_path, self.profile_dir)
        return VLLMSettings(
            model_path=model_path,
            enabled=self.vllm_enabled,
            device=device,
            dtype=picked.dtype,
            enforce_eager=picked.eager,
            reason=picked.reason,
            max_input_tokens=self.max_input_tokens,
            stall_s=self.engine_stall_s,
            # the rest as VLLM_<NAME> sets them
            **{name: getattr(self, f"vllm_{name}") for name in VLLM_AS_SET},
        )

    @classmethod
    def from_env(cls, **overrides) -> Config:
        """Every field can be set by the upper-case environment variable of its name."""
        values = {}
        for f in fields(cls):
            raw = os.environ.get(f.name.upper())
            if raw is None:
                continue
            kind = type(f.default)
            values[f.name] = _flag(raw) if kind is bool else kind(raw)
        values.update(overrides)
        return cls(**values)
