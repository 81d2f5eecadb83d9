"""The compiled decode step's graphs, never compiled cold on a round's path: a graph not stored
is built in a child process while the rounds that need it decode eager, then loaded.

Only the GGUF's blocks form is built aside: its graphs are unfrozen, so Inductor stores them on
disk and another process loads them (the dense forms freeze their weights into each graph, which
Inductor never stores: a child's build would be lost, so they still compile where they are needed).

- `stored(settings, shape)`: a marker under Inductor's cache folder, written once a process has
  made that graph (one width and cache length: batcher/static/shapes.py), keyed by what it
  depends on: the model, the form, the shapes, torch. Gone with the cache it stands for.
- `Build`: `python -m batcher.static.graphs SETTINGS_JSON SHAPES_JSON [PARENT_PID]`, the runner's
  warm-up of those shapes alone in a process of its own (the worker's environment, so the same
  cache and keys), which writes their markers; it dies with its worker, and waits for another
  process building the same model and form's graphs (a replica beside it), then builds only what
  that one did not. The worker's model thread looks at it between rounds and,
  when it is done, warms the shapes up itself: loaded, not compiled, under the fences a compile
  takes (batcher/static/worker.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from batcher.settings import BLOCKS, StaticSettings

log = logging.getLogger(__name__)
# Inductor's settings for these graphs, set around the round that makes or loads one (Runner.generate):
# cpp_wrapper calls a step's kernels from C++, not through Python: a faster step for a longer build,
# in the child (docs/performance.md#the-blocks-compiled-once-loaded-at-every-start). In the markers' key.
OPTIONS = {"cpp_wrapper": True}
PR_SET_PDEATHSIG = 1  # prctl(2)


def _stem(settings: StaticSettings) -> Path:
    """Where this model and form's markers go, less the shape's part of the name."""
    import torch
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    from batcher.checkpoint import gguf_source

    source = gguf_source(settings.model_path)
    stat = source.stat() if source is not None else None
    what = {
        "model": os.path.abspath(settings.model_path),
        "source": [str(source), stat.st_size, stat.st_mtime_ns] if stat else None,
        "form": [settings.device, settings.dtype, settings.batch_size],
        "cache": [settings.max_input_tokens, settings.max_tokens_limit],
        "torch": torch.__version__,
        "inductor": OPTIONS,
        "step": "batcher.static.decode.next_logits",  # what is compiled (transformers' generate() compiled another)
    }
    key = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:24]
    return Path(cache_dir()) / "static-graphs" / key


def _marker(settings: StaticSettings, shape: tuple[int, int]) -> Path:
    stem = _stem(settings)
    return stem.with_name(f"{stem.name}-{shape[0]}x{shape[1]}")


def builds_aside(settings: StaticSettings) -> bool:
    """Whether this form's graphs may be built in a child process (stored on disk: blocks on a CPU)."""
    return settings.compile and settings.dtype == BLOCKS and settings.device == "cpu"


def stored(settings: StaticSettings, shape: tuple[int, int]) -> bool:
    return _marker(settings, shape).is_file()


def mark(settings: StaticSettings, shape: tuple[int, int]) -> None:
    marker = _marker(settings, shape)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"model": settings.model_path, "dtype": settings.dtype}) + "\n")


class Build:
    """The child process that builds the graphs of `shapes`: `done()` is None while it runs, then
    whether it made them (its log lines go to the worker's stderr, named)."""

    def __init__(self, settings: StaticSettings, shapes: list[tuple[int, int]]):
        self.shapes = shapes
        args = [json.dumps(dataclasses.asdict(settings)), json.dumps(shapes), str(os.getpid())]
        self.process = subprocess.Popen([sys.executable, "-m", __name__, *args], stdin=subprocess.DEVNULL)
        shown = ", ".join(f"{rows} row(s) x {length}" for rows, length in shapes)
        log.info("static engine: a child process (pid %d) builds the graphs of %s", self.process.pid, shown)

    def done(self) -> bool | None:
        code = self.process.poll()
        return None if code is None else code == 0

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
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
        seconds = Runner(settings).warm_up(wanted)
        for shape in wanted:
            mark(settings, shape)
    log.info("the static engine's graphs are built and stored in %.1fs", seconds)


if __name__ == "__main__":
    main(*sys.argv[1:])
