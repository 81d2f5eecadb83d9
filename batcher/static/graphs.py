"""The compiled decode step's graphs, never compiled on a round's path: a graph not stored is
built in a child process while the rounds that need it decode eager, then loaded.

Every form on a CPU is built aside: its graphs are unfrozen (the weights, GGUF blocks or packed for
oneDNN, stay the graph's inputs: one copy, the model's), so a graph holds code alone and another
process can load it. On a GPU the step compiles where it is first needed (CUDA graphs).

- A graph is Dynamo's ahead-of-time compile of `decode.next_logits` for one width and cache
  length (batcher/static/shapes.py): traced and built by Inductor once (`build`), saved whole, and
  loaded by a later process in a second or two (`load`): no tracing at load, so nothing the fence
  (batcher/fence.py) guards, and no Inductor cache lookup. It has no guards (the runner picks the
  graph by shape); it remembers the source it traced, and one traced from source that changed
  since is built again.
- `stored(settings, shape)`: the graph's file under Inductor's cache folder, keyed by what it
  depends on: the model, the form, the shapes, torch, the CPU. Gone with the cache it belongs to.
- `Build`: `python -m batcher.static.graphs SETTINGS_JSON SHAPES_JSON [PARENT_PID]`, a process
  of its own (the worker's environment, so the same cache and keys) that builds and stores those
  shapes' graphs; it dies with its worker, and waits for another process building the same model
  and form's graphs (a replica beside it), then builds only what that one did not. The worker's
  model thread looks at it between rounds and, when it is done, loads them (batcher/static/worker.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import hashlib
import importlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from batcher.settings import StaticSettings

log = logging.getLogger(__name__)
# Inductor's settings for these graphs, set around the round that makes or loads one (Runner.generate):
# cpp_wrapper calls a step's kernels from C++, not through Python: a faster step for a longer build,
# in the child (docs/performance.md#the-blocks-compiled-once-loaded-at-every-start). In the markers' key.
OPTIONS = {"cpp_wrapper": True}
PR_SET_PDEATHSIG = 1  # prctl(2)
PACE_S = 0.05  # how often a build looks whether the worker serves (Build): what a request shares with it


def _stem(settings: StaticSettings) -> Path:
    """Where this model and form's graphs go, less the shape's part of the name."""
    import torch
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    from batcher.checkpoint import gguf_source
    from batcher.profile.store import cpu_info

    source = gguf_source(settings.model_path)
    stat = source.stat() if source is not None else None
    what = {
        "model": os.path.abspath(settings.model_path),
        "source": [str(source), stat.st_size, stat.st_mtime_ns] if stat else None,
        "form": [settings.device, settings.dtype, settings.batch_size],
        "cache": [settings.max_input_tokens, settings.max_tokens_limit],
        "torch": torch.__version__,
        "cpu": cpu_info(),  # its C++ is built for this CPU's instructions: a copied cache builds again
        "inductor": OPTIONS,
        "step": "batcher.static.decode.next_logits, ahead of time",  # what is compiled, and how
    }
    key = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:24]
    return Path(cache_dir()) / "static-graphs" / key


def _path(settings: StaticSettings, shape: tuple[int, int]) -> Path:
    stem = _stem(settings)
    return stem.with_name(f"{stem.name}-{shape[0]}x{shape[1]}.graph")


def builds_aside(settings: StaticSettings) -> bool:
    """Whether this form's graphs may be built in a child process (stored on disk: on a CPU)."""
    return settings.compile and settings.device == "cpu"


def stored(settings: StaticSettings, shape: tuple[int, int]) -> bool:
    return _path(settings, shape).is_file()


def build(runner, shapes: list[tuple[int, int]]) -> float:
    """Trace, compile and store the decode step's graph of each shape, and hand it to `runner`
    (which decodes through it from then on); seconds."""
    import torch

    from batcher.static import decode
    from batcher.static.shapes import static_cache

    started = time.perf_counter()
    for rows, length in shapes:
        tokens, positions = (torch.zeros(rows, 1, dtype=torch.long, device=runner.device) for _ in range(2))
        mask = torch.ones(rows, length, dtype=torch.long, device=runner.device)
        cache = static_cache(runner.model, rows, length, runner.device)
        example = (runner.model, tokens, mask, positions, cache)  # distinct tensors: traced as distinct inputs
        # no guards: the runner calls each graph only with its own shape, and Dynamo cannot store
        # those that check objects' identities (the model's modules). A new dict: compile takes it apart
        options = {"guard_filter_fn": torch.compiler.skip_all_guards_unsafe}
        step = torch.compile(decode.next_logits, fullgraph=True, dynamic=False, options=options)
        with torch.inference_mode(), torch._inductor.config.patch(OPTIONS):  # rounds run in inference mode
            graph = step.aot_compile((example, {}))
        path = _path(runner.settings, (rows, length))
        path.parent.mkdir(parents=True, exist_ok=True)
        graph.save_compiled_function(str(path))  # written whole, then renamed: never half a file
        runner.use_graph((rows, length), graph)
    return time.perf_counter() - started


def load(settings: StaticSettings, shape: tuple[int, int]):
    """The stored graph of this shape, ready to call as `decode.next_logits`; None where none is
    stored, or the one stored cannot serve (unreadable, or traced from source that changed since:
    removed, so that it is built again; the log says which)."""
    import torch
    from torch._dynamo.package import _hash_sourcelines  # private: torch's own check for its stored graphs

    from batcher.static import decode

    path, started = _path(settings, shape), time.perf_counter()
    try:
        with open(path, "rb") as stored_graph:
            graph = torch.compiler.load_compiled_function(stored_graph, f_globals=vars(decode))
        changed = [
            source.module
            for source in graph.source_info().inlined_sources
            if _hash_sourcelines(importlib.import_module(source.module), source.firstlineno, source.lastlineno)
            != source.checksum
        ]
    except FileNotFoundError:
        return None
    except Exception as exc:  # a file from another torch, or cut short: build it again
        reason = f"{type(exc).__name__}: {exc}"
        log.warning("static engine: the stored graph %s cannot be loaded (%s); it is built again", path.name, reason)
        path.unlink(missing_ok=True)
        return None
    if changed:
        changed = ", ".join(sorted(set(changed)))
        log.info("static engine: the stored graph %s was traced from source since changed (%s)", path.name, changed)
        path.unlink(missing_ok=True)
        return None
    log.info("static engine: the decode graph of %d row(s) x %d loaded in %.1fs", *shape, time.perf_counter() - started)
    return graph


class Build:
    """The child process that builds the graphs of `shapes`: `done()` is None while it runs, then
    whether it made them (its log lines go to the worker's stderr, named). It builds only while
    the worker serves nothing: stopped (SIGSTOP, with the compilers it runs: its own process
    group) whenever `busy()`, continued once idle, looked at every PACE_S. Beside requests, at
    any CPU priority, a build slowed the worker's answers several times over (docs/performance.md, "The graphs
    stored whole"). Its group stays in the worker's session, so that the worker's death, even a
    SIGKILL, orphans it and the kernel continues it (SIGHUP, SIGCONT): never left stopped."""

    def __init__(self, settings: StaticSettings, shapes: list[tuple[int, int]], busy=lambda: False):
        self.shapes, self.paused = shapes, False
        args = [json.dumps(dataclasses.asdict(settings)), json.dumps(shapes), str(os.getpid())]
        command = [sys.executable, "-m", __name__, *args]
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, process_group=0)
        shown = ", ".join(f"{rows} row(s) x {length}" for rows, length in shapes)
        log.info("static engine: a child process (pid %d) builds the graphs of %s", self.process.pid, shown)
        threading.Thread(target=self._pace, args=(busy,), name="graph-build-pace", daemon=True).start()

    def _pace(self, busy) -> None:
        while self.process.poll() is None:
            if busy() != self.paused:
                self.pause(not self.paused)
            time.sleep(PACE_S)

    def pause(self, paused: bool) -> None:
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
            os.killpg(self.process.pid, signal.SIGSTOP if paused else signal.SIGCONT)
        self.paused = paused

    def done(self) -> bool | None:
        code = self.process.poll()
        return None if code is None else code == 0

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # SIGKILL ends stopped processes too
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def _die_with(parent: int) -> None:
    """End this child when the worker does, even one killed with SIGKILL, which runs no clean-up:
    Linux's parent-death signal (sent when the thread that started the child ends: the model
    thread, which stops its build anyway), and a parent already gone ends it here."""
    prctl = getattr(ctypes.CDLL(None), "prctl", None)
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        sys.exit("graph build: the worker that asked for it is gone")


@contextlib.contextmanager
def _one_build(settings: StaticSettings) -> Iterator[None]:
    """One build of this model and form's graphs at a time on this machine (replicas share the
    cache): a second waits, then finds them stored. An flock: a killed build leaves none behind."""
    lock = _stem(settings).with_suffix(".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield


def main(shown: str, shapes: str, parent: str = "0") -> None:
    if int(parent):
        _die_with(int(parent))
    # the cores' last claim, its compilers' too (they inherit it), for the moments before the
    # worker stops it (Build): a build that waits costs only eager rounds a while longer
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    from batcher.compile_cache import import_torch_first, use_compile_cache

    import_torch_first()  # as the service does: the caches' keys depend on it
    logging.basicConfig(level=logging.INFO, format="graph build: %(message)s")
    values = json.loads(shown)
    values["profile_step_s"] = tuple(tuple(pair) for pair in values["profile_step_s"])
    settings = StaticSettings(**values)
    use_compile_cache("", settings.device)  # the worker's folders (inherited), and the keys' settings
    with _one_build(settings):
        wanted = [tuple(shape) for shape in json.loads(shapes) if not stored(settings, tuple(shape))]
        if not wanted:
            log.info("the static engine's graphs were stored by another process meanwhile")
            return
        from batcher.static.runner import Runner, set_torch_threads

        set_torch_threads(settings.torch_threads)
        seconds = build(Runner(settings), wanted)
    log.info("the static engine's graphs are built and stored in %.1fs", seconds)


if __name__ == "__main__":
    main(*sys.argv[1:])
