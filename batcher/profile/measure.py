"""Measure this machine's candidates within a time budget, in the order of what can win.

Per engine, every dtype it takes on this device (fp32, fp16, bf16), eager and compiled
(STATIC_COMPILE for the static engine, VLLM_ENFORCE_EAGER for vLLM), with the service's default
settings (so that what the profile compiles is what `make serve` finds in the cache; both import
torch first for that, batcher/compile_cache.py's `import_torch_first`). Each: the greedy
chat completions of the fidelity prompts against the static engine's fp32 eager (the reference,
measured first), France -> Paris, its start (and compile) seconds, and, only when faithful, one
call of 1, 4 (and, vLLM only, 64) prompts of 20 tokens (the fidelity calls were the warm-up).

The order (`candidates`, `next_candidate`): the eager rows first, fp32 (the reference, static
then vLLM's, its fallback), each engine's GGUF blocks (fp32's answers), fp16 and bf16 (a few
seconds each once an engine is built; bf16 was unfaithful on every CPU measured so far, yet
defaults are decided by measuring); then, per engine, the compiled form of its fastest faithful
eager row (what can win: compiling changes no answer, is faster where measured, but slow from a
cold cache; every form's graphs are stored on a CPU, and `auto` passes over a row that says it
compiles again at every start: choose.py), vLLM's first (the static engine's compiled
graphs pad every round to BATCH_SIZE rows, which costs a one-prompt run); then the other compiled
rows, each only where its eager row was faithful (the figures:
docs/performance.md#the-machine-profile-faithful-first-then-fastest). Every engine keeps one
process for its candidates (session.py). Each candidate has a cap, CAP_SHARE of the budget (each
engine's first, fp32 eager: all that is left): the child stops it once its projection passes the
cap ("too slow"), the parent kills it at the cap ("timed out"); a candidate the budget cannot
start is recorded as such. The reference alone runs whatever the budget: it has the whole budget
from when its child is ready, however long that child's imports took.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

from batcher.checkpoint import gguf_source
from batcher.compile_cache import kernel_dir
from batcher.profile import choose, fidelity, session, store
from batcher.settings import BLOCKS, StaticSettings, VLLMSettings

DTYPES = ("float32", "float16", "bfloat16")
SIZES = {"static": (1, 4), "vllm": (1, 4, 64)}
TIMED_TOKENS, BUDGET_S = 20, 200.0
CAP_SHARE = 0.4  # of the budget, per candidate: one slow candidate cannot starve the rest
MIN_START_S = 10.0  # less left than this: not started (no engine builds and answers in that)
IMPORTS_S = 300.0  # the most the reference's child may take to import (its engine's packages)
# Prompts per fidelity call: vLLM takes all 20 at once (as it would batch them); the static
# engine BATCH_SIZE, which lets a candidate stop after the call where the bar went out of reach,
# run in turn alone (rounds of 1) and as one round of BATCH_SIZE (`widths`): the two widths
# it serves, whose linears read different weight formats in fp16 (batcher/static/linear.py), so
# that the faithful rule judges both (the compiled engine pads both to BATCH_SIZE rows).
ALL_AT_ONCE = len(fidelity.PROMPTS)
# Quantized routes and the CPU flags their kernels need; noted as not measured where the CPU lacks them.
QUANTIZED = {"4-bit CPUWNA16 (vLLM)": ("avx512f",), "int8 W8A8 (vLLM)": ("avx512_vnni", "avx_vnni")}


def templates(model_path: str) -> tuple[StaticSettings, VLLMSettings]:
    """The service's default settings on a CPU (tests/integration/test_profile.py checks them against
    Config's), so that what the profile compiles is what `make serve` finds in the cache."""
    static = StaticSettings(model_path, "cpu", "float32", False, "", 4, 0.0, 256, 512, 512, 0, 300.0)
    return static, VLLMSettings(model_path, True, "cpu", "float32", True, "", 64, 2048, 512, 0.5, 0.5, 256, 1, 300.0)


def candidates() -> list[tuple[str, str, bool]]:
    """(engine, dtype, eager), every one the profile may measure; the first is the reference.
    Each engine's GGUF blocks come right after the fp32 rows: they are fp32's answers (the
    reference *is* the blocks, dequantized) at a third of fp16's bytes; compiled, with the others."""
    order = [(dtype, True) for dtype in DTYPES] + [(dtype, False) for dtype in DTYPES]
    listed = [(engine, dtype, eager) for dtype, eager in order for engine in ("static", "vllm")]
    blocks = [(engine, BLOCKS, eager) for eager in (True, False) for engine in ("static", "vllm")]
    return listed[:2] + blocks[:2] + listed[2:] + blocks[2:]


def next_candidate(todo: list[tuple[str, str, bool]], rows: list[dict]) -> tuple[str, str, bool]:
    """The next of `todo` (in `candidates`' order) to measure, given the rows so far: every eager
    row first, then per engine (vLLM first) the compiled form of its fastest faithful eager row
    among those a later start loads (choose.best_to_compile), then the rest as they come."""
    eager = [candidate for candidate in todo if candidate[2]]
    if eager:
        return eager[0]
    for engine in ("vllm", "static"):
        best = choose.best_to_compile(rows, engine)
        if best is not None and (engine, best["dtype"], False) in todo:
            return engine, best["dtype"], False
    return todo[0]


def skipped(candidate: tuple[str, str, bool], rows: list[dict], left_s: float, gguf: bool = True) -> str | None:
    """Why `candidate` is not run, given the rows so far, the budget's seconds left and whether the
    model came from a GGUF file (`gguf`: it has blocks to read); None: run it."""
    engine, dtype, eager = candidate
    if rows and rows[0].get("status") != "measured":
        return "not run: no reference"
    if dtype == BLOCKS and not gguf:
        return "not run: the model was not converted from a GGUF file (no blocks to read)"
    if not eager:  # compiling changes no answer here: its eager row's fidelity decides, not its speed
        mine = next((r for r in rows if (r["engine"], r["dtype"], r["eager"]) == (engine, dtype, True)), None)
        if mine is not None and not faithful_answers(mine):
            unfaithful = mine.get("of") == len(fidelity.PROMPTS) or mine["status"].startswith("not faithful")
            return f"not run: {dtype} eager {'was not faithful' if unfaithful else mine['status']}"
    if left_s < MIN_START_S:
        return "timed out: budget spent before it started"
    return None


def faithful_answers(row: dict) -> bool:
    """Its fidelity measured in full and over the bar, whether or not its speed was (choose.faithful
    asks both)."""
    full = row.get("of") == len(fidelity.PROMPTS)
    return full and row.get("prefix", 0) >= fidelity.MIN_PREFIX and bool(row.get("france"))


def quantized_notes(flags: list[str]) -> list[str]:
    return [
        f"{route}: not measured, this CPU lacks {' / '.join(needs)}"
        for route, needs in QUANTIZED.items()
        if not set(needs) & set(flags)
    ]


def speed_prompts(n: int) -> list[str]:
    """n distinct prompts (vLLM's prefix cache would make repeats cheap)."""
    prompts = fidelity.PROMPTS
    return [prompts[i % len(prompts)] + (f" ({i})" if i >= len(prompts) else "") for i in range(n)]


def spec_for(candidate: tuple[str, str, bool], base, texts: list[str], reference, **how) -> dict:
    """What the child runs for `candidate`: `base` (its engine's settings) varied in dtype and decoding."""
    engine, dtype, eager = candidate
    fast = {"compile": not eager} if engine == "static" else {"enforce_eager": eager}
    if how.get("cache"):  # the block kernels are built under the compile cache
        fast["kernel_dir"] = kernel_dir(how["cache"])
    settings = dataclasses.replace(base, dtype=dtype, reason="profile candidate", **fast)
    chunk = settings.batch_size if engine == "static" else ALL_AT_ONCE
    widths = [1, settings.batch_size] if engine == "static" else [chunk]
    sizes = how.get("sizes", SIZES)[engine]
    return dict(
        engine=engine, settings=dataclasses.asdict(settings), compile_cache_dir=how.get("cache", ""),
        texts=texts, max_tokens=fidelity.MAX_TOKENS, chunk=chunk, widths=widths, reference=reference,
        timed=[speed_prompts(n) for n in sizes], timed_tokens=TIMED_TOKENS, repeats=how.get("repeats", 1),
        speed_always=how.get("speed_always", False),
    )  # fmt: skip


def row_for(candidate: tuple[str, str, bool], result: dict, sizes) -> dict:
    """The profile's row from the child's merged events (choose.py's shape)."""
    engine, dtype, eager = candidate
    row = {"engine": engine, "dtype": dtype, "eager": eager, "status": result["status"]}
    if "start_s" in result:
        row.update(start_s=round(result["start_s"], 1), compile_s=result.get("compile_s"))
        row.update({k: result[k] for k in ("stored", "memory_mib") if k in result})
        if "warm_start_s" in result:
            row["warm_start_s"] = round(result["warm_start_s"], 1)
    row.update({k: result[k] for k in ("exact", "of", "prefix", "france", "france_bar", "france_text") if k in result})
    runs = result.get("runs") or []
    row["speed"] = {str(n): round(statistics.median(r), 3) for n, r in zip(sizes, runs, strict=False)}
    return {**row, "seconds": result.get("seconds", 0)}


def measure(model_path: str, log_path: Path, budget_s: float = BUDGET_S, only=None, base=None, **how) -> dict:
    """The profile: every candidate (or those in `only`, and the reference) within `budget_s`
    seconds in all (the reference past them where its child's imports took them). `base`:
    (StaticSettings, VLLMSettings) to vary (default: `templates`); `how`: `cache` (the compile
    cache folder), `repeats`, `sizes`, `speed_always` (time unfaithful rows too)."""
    started, key = time.monotonic(), store.machine_key(model_path)
    deadline, base = started + budget_s, base or templates(model_path)
    todo = [c for c in candidates() if only is None or c in only or c == candidates()[0]]
    with open(log_path, "a") as log:
        children = session.Children(log, how.get("cache", ""))
        try:
            engines = list(dict.fromkeys(engine for engine, _, _ in todo))
            children.spawn(engines)
            from transformers import AutoTokenizer  # while the children import theirs

            texts, form = fidelity.prompt_texts(AutoTokenizer.from_pretrained(model_path))
            rows, reference = [], None
            print(f"  fidelity prompts: {fidelity.FORMS[form]}", flush=True)
            # the reference is measured whatever the budget: every other row is judged against it,
            # and without it the profile chooses nothing. Its child may import past the budget's
            # end (within IMPORTS_S), and the row has the whole budget once that child is ready
            children.ready([todo[0][0]], started + max(budget_s, IMPORTS_S))
            children.ready(engines, deadline)
            reference_end = time.monotonic() + budget_s
            while todo:
                candidate = next_candidate(todo, rows)
                todo.remove(candidate)
                end = deadline if rows else reference_end
                why = skipped(candidate, rows, end - time.monotonic(), gguf_source(model_path) is not None)
                if why is None:
                    # an engine's first row (fp32 eager: the reference, and vLLM's fallback) runs
                    # to what is left, unprojected: without it that engine has nothing measured
                    # (a capped one left vLLM with none: docs/performance.md#per-cpu-kind)
                    first = not any(row["engine"] == candidate[0] for row in rows)
                    cap = budget_s if first else CAP_SHARE * budget_s
                    spec = spec_for(candidate, base[candidate[0] == "vllm"], texts, reference, **how)
                    spec["project"] = not first  # the first runs to its cap (candidate._over)
                    result = children.measure(candidate[0], spec, cap, end)
                    reference = reference or result.get("completions")
                    rows.append(row_for(candidate, result, how.get("sizes", SIZES)[candidate[0]]))
                else:
                    rows.append(dict(zip(("engine", "dtype", "eager"), candidate, strict=True), status=why))
                print(f"  {rows[-1]}", flush=True)
        finally:
            children.close()
    first = rows[0]
    return {
        "key": key,
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "budget_s": budget_s,
        "cap_s": round(CAP_SHARE * budget_s),
        "wall_s": round(time.monotonic() - started),
        "reference": "measured" if first.get("status") == "measured" else first.get("status"),
        "prompts": form,  # fidelity.FORMS: through the chat template, or as plain completions
        "notes": quantized_notes(key["cpu"].get("flags", [])),
        # the larger child's imports (vLLM's): what a worker holds besides its engines' rows
        # (its own small parts, Flask and SQLAlchemy, not counted)
        "base_mib": children.base_mib or None,
        "rows": rows,
    }
