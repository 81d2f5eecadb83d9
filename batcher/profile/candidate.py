"""One candidate, measured inside the child (child.py --serve): built, its fidelity against the
reference chunk by chunk, stopping once the bar is out of reach (fidelity.out_of_reach), then its
speed, only when faithful (or `speed_always`: every row whole, timed, as the bench's fidelity
phase wants), and only while what it is projected to take stays
within its cap: the seconds of a decode step in the fidelity chunks, times the steps left.

Events, one JSON line per stage, so that a candidate the parent kills at its cap keeps what it had
measured: {"event": "built", start_s, compile_s, dtype, stored, warm_start_s}; {"event":
"fidelity", exact, of, prefix, france, france_text, completions}; then {"event": "done", status,
runs?, memory_mib}: status "measured", "not faithful: ...", "too slow: projected N s, over its
cap of C s" or "failed: ...". memory_mib: what the process grew by from before the build (the
allocator's free pages handed back first: batcher/memory.py) to the end of its runs. An estimate:
a child's first engine also brings the imports its build makes (a worker holds them too), and a
dropped vLLM engine is not freed (it stays counted in the base of the next, never in its row).
"""

from __future__ import annotations

import math
import time
import timeit
import traceback
from functools import partial

from batcher.memory import release_free_memory, resident_mib
from batcher.profile import fidelity


def measure(spec: dict, build, emit) -> None:
    """`spec`: the child spec (child.py) plus `cap_s`, `chunk` (prompts per fidelity call),
    `reference` (None: this is the reference) and `speed_always`; `build(spec)`: the engine."""
    started = time.monotonic()
    try:
        release_free_memory()  # the engine measured before was dropped: its freed pages are not counted
        base = resident_mib()
        engine = build(spec)
        base = engine.built.pop("memory_base_mib", base)  # past what only building needed (child.py)
        emit({"event": "built", **engine.built})
        status, step_s = _fidelity(spec, engine, emit, started)
        runs, why = ([], None) if status else _speed(spec, engine, started, step_s)
        memory = resident_mib() - base  # weights, graphs, caches, what the rounds left held
        emit({"event": "done", "status": status or why or "measured", "runs": runs, "memory_mib": memory})
    except Exception as exc:  # this candidate fails; the child goes on with the next one
        traceback.print_exc()
        emit({"event": "done", "status": f"failed: {type(exc).__name__}: {exc}"[:200]})


def _fidelity(spec: dict, engine, emit, started: float) -> tuple[str | None, float]:
    """(why it stopped or None, the slowest chunk's seconds per decode step)."""
    texts, reference, chunk = spec["texts"], spec.get("reference"), spec.get("chunk") or len(spec["texts"])
    widths = spec.get("widths") or [chunk]  # the chunks' rounds, in turn (static: alone, then BATCH_SIZE)
    completions, step_s, why = [], 0.0, None
    for i in range(0, len(texts), chunk):
        begun, size = time.monotonic(), widths[(i // chunk) % len(widths)]
        completions += engine.generate(texts[i : i + chunk], spec["max_tokens"], ignore_eos=False, size=size)
        step_s = max(step_s, (time.monotonic() - begun) / spec["max_tokens"])
        paris = engine.decode(completions[fidelity.PARIS_INDEX])
        said = reference if reference and len(reference) > fidelity.PARIS_INDEX else completions
        reference_paris = engine.decode(said[fidelity.PARIS_INDEX])
        # the reference (None): itself
        compared = fidelity.compare(reference or completions, completions, paris, reference_paris)
        emit({"event": "fidelity", **compared, "completions": completions})  # so far: a killed row keeps it
        if reference is not None and not spec.get("speed_always"):
            why = fidelity.out_of_reach(reference, completions, compared["france"])
        chunks_left = math.ceil((len(texts) - len(completions)) / chunk)
        left = chunks_left * chunk_cost(step_s, spec["max_tokens"]) + sum(speed_costs(spec, engine.batch, step_s))
        if why is None and _over(spec, started, left):
            why = too_slow(spec, started, left)
        if why:
            break
    unfaithful = not (compared["france"] and compared["prefix"] >= fidelity.MIN_PREFIX)
    if why is None and unfaithful and not spec.get("speed_always"):
        france = "right" if compared["france"] else "wrong"
        why = f"not faithful: agreeing prefix {compared['prefix']:.2f}, France {france}"
    return why, step_s


def chunk_cost(step_s: float, tokens: int) -> float:
    return step_s * tokens


def speed_costs(spec: dict, batch: int, step_s: float) -> list[float]:
    """Each timed run's projected seconds, from the fidelity chunks' slowest decode step. Static:
    a round per BATCH_SIZE prompts, half its step's cost per row (a round of one row costs a
    little over half a full one: docs/performance.md#the-machine-profile-faithful-first-then-fastest);
    vLLM (batch 0): one call, dearer with more prompts than a fidelity chunk. Both err slow (a
    shorter prompt, a smaller call steps faster)."""
    chunk = spec.get("chunk") or len(spec["texts"])
    sizes = [len(prompts) for prompts in spec.get("timed", [])]
    rows = lambda n: math.ceil(n / batch) * (0.5 + 0.5 * min(n, batch) / batch)  # noqa: E731
    per_run = [rows(n) if batch else max(1.0, n / chunk) for n in sizes]
    return [spec.get("repeats", 1) * n * chunk_cost(step_s, spec["timed_tokens"]) for n in per_run]


def _over(spec: dict, started: float, left_s: float) -> bool:
    """Projected past the cap; never for the reference (`project` False): every other row needs
    it, and one slow round (another process's burst) may pass; the parent's kill still holds."""
    return spec.get("project", True) and time.monotonic() - started + left_s > spec["cap_s"]


def too_slow(spec: dict, started: float, left_s: float) -> str:
    projected = time.monotonic() - started + left_s
    return f"too slow: projected {projected:.0f} s, over its cap of {spec['cap_s']:.0f} s"


def _speed(spec: dict, engine, started: float, step_s: float) -> tuple[list[list[float]], str | None]:
    """Each timed run's seconds (`repeats` each; the fidelity chunks were the warm-up), and why it
    stopped early (the runs left projected past the cap) or None."""
    runs, costs = [], speed_costs(spec, engine.batch, step_s)
    for i, prompts in enumerate(spec.get("timed", [])):
        if _over(spec, started, sum(costs[i:])):
            return runs, too_slow(spec, started, sum(costs[i:]))
        one = partial(engine.generate, prompts, spec["timed_tokens"])
        runs.append(timeit.repeat(one, "gc.enable()", number=1, repeat=spec.get("repeats", 1)))
    return runs, None
