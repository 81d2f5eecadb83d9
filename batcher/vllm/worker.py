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
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from batcher import failpoints, fence
from batcher.engine import EngineThread
from batcher.errors import RoundFailed, ShuttingDown
from batcher.metrics import Metrics
from batcher.predict import VLLMCost
from batcher.sequence import Sequence
from batcher.settings import VLLMSettings
from batcher.vllm.translate import engine_prompt, logprob_records, prompt_logprob_records, refusal, sampling_params

log = logging.getLogger(__name__)


class VLLMWorker(EngineThread):
    """The sequences in the engine are the workload's taken ones (added, or about to be)."""

    name = "vllm"

    def __init__(
        self,
        settings: VLLMSettings,
        *,
        context: Callable[[], AbstractContextManager] = contextlib.nullcontext,
        metrics: Metrics | None = None,
    ):
        super().__init__(
            settings,
            max_queue=settings.max_inbox,
            metrics=metrics,
            enabled=settings.enabled,
            why_disabled="VLLM_ENABLED is off",
        )
        self._context = context
        self.metrics.vllm_waiting.set_function(self.workload.qsize)
        self.metrics.vllm_running.set_function(self.running)
        self.engine = None
        self.steps = 0
        self.cost = VLLMCost(settings.max_num_seqs, prior=settings.profile_step_s)
        self._admitted = False  # sequences joined since the last step: the next one prefills them

    def unfinished(self) -> int:
        """Requests the engine itself still holds (0 once everything was answered or aborted)."""
        return self.engine.get_num_unfinished_requests() if self.engine is not None else 0

    def details(self) -> dict:
        return {"steps": self.steps, "eager": self.settings.enforce_eager}

    def kv_cache(self) -> tuple[float, int, int] | None:
        """vLLM's own KV cache, for /metrics: (fraction of its blocks in use, tokens per block,
        blocks), read from the in-process scheduler without a lock (a gauge may be a step old);
        None until the engine is built."""
        if self.engine is None:
            return None
        cache, scheduler = self.engine.vllm_config.cache_config, self.engine.engine_core.engine_core.scheduler
        return scheduler.get_kv_cache_usage(), cache.block_size, cache.num_gpu_blocks

    # --- the engine thread ---------------------------------------------------------------
    def _build_engine(self):
        # In-process engine: no multiprocessing hop, the same one-process design as the static
        # path. Must be set before vllm is imported.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        s = self.settings
        fence.install()
        from vllm import EngineArgs, LLMEngine

        # vLLM's own queue by each request's priority (batch lines last; FIFO among equals, as
        # "fcfs"), and under KV-cache pressure it preempts a batch line before interactive work
        try:
            return LLMEngine.from_engine_args(EngineArgs(**s.engine_args(), scheduling_policy="priority"))
        except ValueError as exc:  # pydantic's ValidationError is one too
            if "max_model_len" not in str(exc):
                raise
            # vLLM derives the model's length (rope scaling and all) and names its own argument: name ours
            why = next(line for line in str(exc).splitlines() if "max_model_len" in line).split(" To allow")[0]
            raise ValueError(
                f"VLLM_MAX_MODEL_LEN={s.max_model_len} does not fit MODEL: set it (and MAX_INPUT_TOKENS +"
                f" MAX_NEW_TOKENS_LIMIT within it) to the model's length or less. vLLM: {why}"
            ) from exc

    def _load(self) -> None:
        # vLLM's CPU backend probes every attribute of every imported module with hasattr(),
        # and Flask's context-local proxies raise outside a context; the caller passes one.
        # Built here, in the thread that steps it, since OpenMP binds threads per thread.
        # Static rounds go on meanwhile, except while vLLM patches torch process-wide (fence.py).
        failpoints.hit("vllm.load")
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
        while not self.lifecycle.stopping.is_set():
            began = self._admit()
            self._abort_cancelled()
            self.workload.purge_cancelled()  # also while every slot is busy and nothing is taken
            if self.workload.running():
                failpoints.hit("vllm.step")
                self._step(began)
                self._progressed()
            self._note_if_drained()
        self._shutdown()

    def _admit(self) -> float:
        """Add what waits (up to the free slots) to the engine. Returns when this turn of the loop
        had its work in hand (after the wait, if it waited for any): the start of what the step's
        clock measures."""
        room = self.settings.max_num_seqs - self.workload.running()
        if room <= 0:
            return time.perf_counter()
        # Block only when nothing is being decoded; otherwise take what waits now and step on.
        new = self.workload.next_batch(room, idle_timeout=0 if self.workload.running() else None)
        began = time.perf_counter()
        admitted = []
        for seq in new:
            try:
                # nothing is cut here: the service refused an over-long prompt, or cut it as asked
                self.engine.add_request(seq.id, engine_prompt(seq), sampling_params(seq), priority=int(seq.priority))
            except Exception as exc:  # a prompt the engine refuses fails alone
                self.workload.release(seq)
                seq.fail(refusal(seq, exc))
                continue
            admitted.append(seq)
        self._admitted = self._admitted or bool(admitted)
        for ahead, seq in enumerate(admitted):  # joins the running ones at the next step
            seq.start(f"step-{self.steps + 1}", self.workload.running(), None, prefilled_ahead=ahead)
        return began

    def _abort_cancelled(self) -> None:
        cancelled = [seq for seq in self.workload.taken() if seq.cancelled]
        if not cancelled:
            return
        self.engine.abort_request([seq.id for seq in cancelled])
        for seq in cancelled:
            self.workload.release(seq)
            seq.finish("cancelled")

    def _step(self, began: float) -> None:
        """One engine step, and its outputs handed to their sequences. The cost model's clock
        times the whole turn of the loop from `began` (admitting, the step, the outputs): what a
        request arriving now waits for, not the step alone."""
        self.steps += 1
        width, admitted = self.workload.running(), self._admitted
        self._admitted = False
        try:
            waiting = time.perf_counter()
            with fence.model_work():  # never while the static engine compiles (fence.py)
                began += time.perf_counter() - waiting  # the clock times the step, not that wait
                outputs = self.engine.step()
        except Exception as exc:  # fail what was in the engine; the thread lives on
            log.exception("vLLM step %d failed", self.steps)
            failed = self.workload.taken()
            self._abort_quietly(failed, f"after step {self.steps} failed")
            error = RoundFailed(f"vLLM step failed: {type(exc).__name__}: {exc}")
            for seq in failed:
                self.workload.release(seq)
                seq.fail(error)
            return
        self.metrics.vllm_steps.inc()
        for out in outputs:
            seq = self.workload.find(out.request_id)
            if seq is None:
                continue
            completion = out.outputs[0]
            if seq.prompt_tokens is None and out.prompt_token_ids is not None:
                seq.prompt_tokens = len(out.prompt_token_ids)
            if out.prompt_logprobs and seq.prompt_logprobs is None:  # all of them, at the end of the prefill
                seq.prompt_logprobs = prompt_logprob_records(
                    seq, out.prompt_token_ids, out.prompt_logprobs, self.engine.get_tokenizer()
                )
            seq.add_tokens(completion.token_ids, logprob_records(seq, completion))
            seq.add_text(completion.text)
            self.metrics.generated_tokens.labels(self.name).inc(len(completion.token_ids))
            if out.finished:
                self.workload.release(seq)
                seq.finish(completion.finish_reason or "length")
                self._finished(seq)
        self.cost.observe(width, time.perf_counter() - began, admitted=admitted)

    def _abort_quietly(self, seqs: list[Sequence], when: str) -> None:
        """Abort in the engine, where the sequences are resolved anyway: a failure to abort must
        not keep them from being answered, so it is logged, not raised."""
        if not seqs:
            return
        try:
            self.engine.abort_request([seq.id for seq in seqs])
        except Exception:
            log.exception("vLLM could not abort %d requests %s", len(seqs), when)

    def _shutdown(self) -> None:
        left = self.workload.taken()
        self.lifecycle.abandon(len(left))
        self._abort_quietly(left, "at shutdown")
        stop = ShuttingDown("the vLLM engine shut down before this prompt finished")
        for seq in left:
            self.workload.release(seq)
            seq.fail(stop)
        self._fail_waiting("the vLLM engine shut down before this prompt ran")


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
