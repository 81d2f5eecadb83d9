"""Settings, read from the environment once, validated once, passed down through constructors."""

from __future__ import annotations

import os
from dataclasses import field, fields
from typing import Annotated

from pydantic import ConfigDict, Field, ValidationError
from pydantic.dataclasses import dataclass

from batcher.checkpoint import CHECKPOINT_NAME, DEFAULT_CACHE_DIR, DEFAULT_MODEL
from batcher.compile_cache import DEFAULT_COMPILE_CACHE_DIR, kernel_dir
from batcher.profile.choose import MEMORY_BUDGET_GIB
from batcher.profile.store import DEFAULT_PROFILE_DIR
from batcher.settings import BLOCKS, StaticSettings, VLLMSettings
from service.setting_words import worded

# VLLMSettings fields that are the Config field `vllm_<name>` as it is
VLLM_AS_SET = "max_num_seqs max_model_len kv_cache_gib gpu_memory_utilization max_inbox tensor_parallel_size".split()


# Threads a generate request never takes (MAX_INFLIGHT_REQUESTS' default is THREADS less these):
# they answer /health, /metrics and the 429s past the cap, one at a time under the GIL; a few
# spare ones cover clients that send a body slowly while a probe still finds one free.
PROBE_THREADS = 8


class SettingError(ValueError):
    """A setting that cannot run: one line naming it, its range and what it got (no traceback)."""


# A numeric setting's range, declared once beside its field: the start-up check reads it, and the
# Knobs table of docs/operations.md shows it (tests/unit/test_settings.py keeps the two equal).
# pydantic does the checking (finite, in range, a number at all); service/setting_words.py words it.
def between(low: float | None = None, high: float | None = None, *, above: float | None = None):
    return Field(ge=low, le=high, gt=above)


# The settings that name one of a few values: what each may be (`auto` resolves from the profile)
CHOICES = {
    "dtype": ("auto", "bfloat16", "float16", "float32"),
    "static_compile": ("auto", "0", "1"),
    "static_weights": ("auto", "dense", "blocks"),
    "vllm_enforce_eager": ("auto", "0", "1"),
    "vllm_weights": ("auto", "dense", "blocks"),
}
# Ranges keep out what cannot work (0 threads, a negative timeout, NaN), not what is unusual.
DAY_S = 86400  # bounds the timeouts: a longer one is a typo, not a plan
FORM_ROOM = 64 * 1024  # what a multipart upload holds besides its file: boundaries, part headers


@dataclass(frozen=True, config=ConfigDict(allow_inf_nan=False, extra="forbid"))
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
    # API_KEY: one key or several, comma-separated: "Authorization: Bearer <key>". Unset: open,
    # for localhost. Set but holding no usable key (an empty Secret) is a start error.
    api_key: str | None = field(default=None, repr=False)
    # CHAT_TEMPLATE: a Jinja chat template file that replaces the model's own (vLLM's --chat-template)
    chat_template: str = ""
    compile_cache_dir: str = DEFAULT_COMPILE_CACHE_DIR  # vLLM's and Inductor's compile caches; "" = theirs
    # static batching
    batch_size: Annotated[int, between(1, 256)] = 4
    batch_wait_ms: Annotated[float, between(0, 60_000)] = 0.0
    max_queue: Annotated[int, between(1, 1_000_000)] = 256
    max_input_tokens: Annotated[int, between(1, 1 << 20)] = 512
    max_new_tokens: Annotated[int, between(1, 1 << 20)] = 20  # default for a request that names no max_tokens
    max_new_tokens_limit: Annotated[int, between(1, 1 << 20)] = 512  # largest max_tokens a request may ask for
    max_prompts_per_request: Annotated[int, between(1, 1_000_000)] = 256
    max_n: Annotated[int, between(1, 1024)] = 8  # largest n (completions per prompt) a request may ask for
    max_body_bytes: Annotated[int, between(1024, 1 << 30)] = 1 << 20
    request_timeout_s: Annotated[float, between(high=DAY_S, above=0)] = 120.0
    # an engine holding work with no progress (token, round, step) this long is failed (crash-only)
    engine_stall_s: Annotated[float, between(high=DAY_S, above=0)] = 300.0
    # xgrammar's cache of compiled grammars, per process (vLLM caps its own at 512 MB)
    grammar_cache_mb: Annotated[int, between(1, 1 << 20)] = 512
    # gunicorn's gthread threads: a request holds one while served, a stream until it ends
    threads: Annotated[int, between(2, 10_000)] = 128
    # generate requests served at once; past it, 429 `too_busy` (service/http/inflight.py).
    # 0: THREADS - PROBE_THREADS, the threads left for /health, /metrics and the refusals
    max_inflight_requests: Annotated[int, between(0, 10_000)] = 0
    # a process of its own answers /health, /livez and /metrics here from what the worker
    # publishes (deploy/probe.py), never behind its GIL; 0: none (the worker's routes still answer)
    probe_port: Annotated[int, between(0, 65535)] = 0
    torch_threads: Annotated[int, between(0, 4096)] = 0  # 0: every core the process may use
    # auto: from the profile on a CPU (fp32 eager without one); compiled on a GPU
    static_compile: str = "auto"  # auto | 0 | 1
    # blocks: the static engine reads the GGUF's own quantized blocks in fp32 (CPU; a model
    # converted from a GGUF); dense: DTYPE's weights; auto: the profile's faithful-then-fastest row
    static_weights: str = "auto"  # auto | dense | blocks
    static_prefix_cache: bool = False  # keep a one-row round's KV cache for the next prompt that extends it
    # the worker's memory the profile's auto choices keep within (CPU; batcher/profile/choose.py)
    memory_budget_gib: Annotated[float, between(high=4096, above=0)] = MEMORY_BUDGET_GIB
    # continuous batching (vLLM)
    vllm_enabled: bool = True
    vllm_max_num_seqs: Annotated[int, between(1, 65536)] = 64
    vllm_max_model_len: Annotated[int, between(2, 1 << 22)] = 2048
    vllm_kv_cache_gib: Annotated[float, between(high=4096, above=0)] = 0.5  # CPU only: vLLM's KV cache, 23k fp16 tokens
    vllm_gpu_memory_utilization: Annotated[float, between(high=1, above=0)] = 0.5  # GPU only
    vllm_max_inbox: Annotated[int, between(1, 1_000_000)] = 256
    # auto: from the profile on a CPU (eager without one); compiled on a GPU
    vllm_enforce_eager: str = "auto"  # auto | 0 | 1
    vllm_weights: str = "auto"  # auto | dense | blocks: as STATIC_WEIGHTS, for the vLLM engine
    vllm_tensor_parallel_size: Annotated[int, between(1, 1024)] = 1  # GPUs one vLLM engine spans
    # serving: gunicorn.conf.py and deploy/settings.py read these (the master too: no torch here)
    port: Annotated[int, between(1, 65535)] = 8000
    gunicorn_timeout: Annotated[int, between(1, DAY_S)] = 300  # the arbiter's heartbeat
    graceful_timeout: Annotated[int, between(1, DAY_S)] = 30  # shutdown grace, which bounds the drain
    replicas: Annotated[int, between(1, 256)] = 2  # `make cluster`'s gunicorns
    client_timeout_s: Annotated[int, between(1, DAY_S)] = 30  # nginx's wait for a request's headers and body
    # batch jobs (service/jobs/): files and batches, kept in a database every replica shares
    data_dir: str = ".data"  # the embedded database (SQLite, WAL) lives here
    database_url: str = ""  # "": sqlite under DATA_DIR; postgresql+psycopg://... past one box
    max_file_bytes: Annotated[int, between(1, 1 << 40)] = 200 << 20  # an uploaded file (OpenAI's bound)
    max_batch_lines: Annotated[int, between(1, 10_000_000)] = 50_000  # lines per batch (OpenAI's bound)
    response_retention_s: Annotated[int, between(1, 100 * 365 * DAY_S)] = 30 * DAY_S  # a stored response (OpenAI's)

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_keys:
            raise SettingError(
                "API_KEY is set but holds no usable key (blank, or separators only): set a key,"
                " or leave API_KEY unset to serve without one"
            )
        unusable = [key for key in self.api_keys if not key.isascii() or not key.isprintable() or " " in key]
        if unusable:
            raise SettingError("API_KEY: a key must be printable ASCII with no spaces (it travels in a header)")
        if self.max_new_tokens > self.max_new_tokens_limit:
            raise SettingError("MAX_NEW_TOKENS must lie in 1..MAX_NEW_TOKENS_LIMIT")
        if not 0 < self.inflight_limit < self.threads:  # 0 is the default: THREADS - PROBE_THREADS
            raise SettingError(
                f"MAX_INFLIGHT_REQUESTS must lie in 1..THREADS - 1, got {self.inflight_limit} (THREADS {self.threads})"
            )
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                words = f"{', '.join(allowed[:-1])} or {allowed[-1]}"
                raise SettingError(f"{name.upper()} must be {words}, got {getattr(self, name)!r}")
        for name in ("static_weights", "vllm_weights"):
            if getattr(self, name) == "blocks" and self.dtype not in ("auto", "float32"):
                raise SettingError(f"{name.upper()}=blocks computes in fp32: DTYPE auto or float32")
        if self.chat_template and not os.path.isfile(self.chat_template):
            raise SettingError(f"CHAT_TEMPLATE must be a file, got {self.chat_template!r}")
        if self.max_input_tokens + self.max_new_tokens_limit > self.vllm_max_model_len:
            raise SettingError("MAX_INPUT_TOKENS + MAX_NEW_TOKENS_LIMIT must fit in VLLM_MAX_MODEL_LEN")

    @property
    def model_name(self) -> str:
        """What the OpenAI routes call the model: SERVED_MODEL_NAME, else the folder's name."""
        if self.served_model_name:
            return self.served_model_name
        if self.model == DEFAULT_MODEL:
            return CHECKPOINT_NAME
        if self.model.endswith(".gguf"):  # a GGUF file: its name, as llama.cpp's server calls it
            return os.path.basename(self.model).removesuffix(".gguf")
        return os.path.basename(os.path.normpath(self.model)) if os.path.isdir(self.model) else self.model

    @property
    def max_model_len(self) -> int:
        """The longest sequence a request can make (prompts keep their last MAX_INPUT_TOKENS), as
        /v1/models and /tokenize report it."""
        return self.max_input_tokens + self.max_new_tokens_limit

    @property
    def api_keys(self) -> list[str]:
        return [key.strip() for key in (self.api_key or "").split(",") if key.strip()]

    @property
    def database(self) -> str:
        """DATABASE_URL, or the SQLite file under DATA_DIR."""
        return self.database_url or f"sqlite:///{os.path.join(self.data_dir, 'jobs.sqlite3')}"

    @property
    def max_upload_bytes(self) -> int:  # an upload's body: the file and the form around it
        return self.max_file_bytes + FORM_ROOM

    @property
    def inflight_limit(self) -> int:
        """MAX_INFLIGHT_REQUESTS, or THREADS less the threads kept for the probes."""
        return self.max_inflight_requests or self.threads - PROBE_THREADS

    def static_engine(self, model_path: str) -> StaticSettings:
        from batcher.device import pick, pick_device, switch

        device = pick_device(self.device)
        eager = None if (compiles := switch(self.static_compile)) is None else not compiles
        dtype, dense = BLOCKS if self.static_weights == "blocks" else self.dtype, self.static_weights == "dense"
        vllm = self.vllm_engine(model_path) if self.vllm_enabled else None  # first: choose.room
        beside, budget = (vllm.dtype, vllm.enforce_eager) if vllm else None, self.memory_budget_gib * 1024
        picked = pick("static", dtype, eager, device, model_path, self.profile_dir, dense, budget, beside)
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
            max_tokens_limit=self.max_new_tokens_limit,
            torch_threads=self.torch_threads,
            stall_s=self.engine_stall_s,
            profile_step_s=picked.step_s,
            kernel_dir=kernel_dir(self.compile_cache_dir),
            prefix_cache=self.static_prefix_cache,
        )

    def vllm_engine(self, model_path: str) -> VLLMSettings:
        from batcher.device import pick, pick_device, switch

        device = pick_device("auto")  # vLLM picks its own platform; DEVICE is the static engine's
        eager, budget = switch(self.vllm_enforce_eager), self.memory_budget_gib * 1024
        dtype, dense = BLOCKS if self.vllm_weights == "blocks" else self.dtype, self.vllm_weights == "dense"
        picked = pick("vllm", dtype, eager, device, model_path, self.profile_dir, dense, budget, "least")
        return VLLMSettings(
            model_path=model_path,
            enabled=self.vllm_enabled,
            device=device,
            dtype=picked.dtype,
            enforce_eager=picked.eager,
            reason=picked.reason,
            max_input_tokens=self.max_input_tokens,
            stall_s=self.engine_stall_s,
            profile_step_s=picked.step_s,
            kernel_dir=kernel_dir(self.compile_cache_dir),
            # the rest as VLLM_<NAME> sets them
            **{name: getattr(self, f"vllm_{name}") for name in VLLM_AS_SET},
        )

    @classmethod
    def from_env(cls, **overrides) -> Config:
        """Every field can be set by the upper-case environment variable of its name. A setting
        out of its range raises SettingError: one line per bad setting, naming it and its range."""
        values: dict = {}
        for f in fields(cls):
            raw = os.environ.get(f.name.upper())
            if raw is not None:
                values[f.name] = raw if f.name == "api_key" else raw.strip()  # pydantic parses the rest
        values.update(overrides)
        try:
            return cls(**values)
        except ValidationError as exc:
            raise SettingError("; ".join(worded(cls, error) for error in exc.errors())) from None
