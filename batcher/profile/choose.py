"""The rule that turns a profile into each engine's `auto`s: faithful first, then fastest.

Pure functions of the measured rows (tests/integration/test_profile.py feeds them fake ones). A row:
{"engine", "dtype", "eager", "status" ("measured", "not faithful: ...", "too slow: ...", "timed out ...",
"failed: ...", "not run: ..."),
"exact", "of", "prefix", "france", "start_s", "compile_s", "speed": {"1": s, "4": s, "64": s},
"warm_start_s" (a later start's seconds), "stored" (False: compiled again at every start),
"memory_mib" (its engine's resident share)}; the profile's "base_mib": a worker's imports.
`auto` takes only rows a later start loads rather than compiles, within MEMORY_BUDGET_GIB.
"""

from __future__ import annotations

from batcher.profile.fidelity import MIN_PREFIX  # the mean agreeing prefix with the static fp32 eager reference

# How much each request size counts: one prompt most (what a newcomer tries first, and a chat
# user's every turn), a round of 4 next (the static engine's default batch), 64 the least (a
# bulk client, who is also the one who reads the docs). Renormalised over the sizes measured.
# So the rule picks for one user at a time: under load the static engine runs full rounds, where
# fp16 can lose what it won at one prompt (docs/performance.md, "Which workload the rule stands for").
WEIGHTS = {"1": 0.6, "4": 0.3, "64": 0.1}
NEAR = 1.05  # candidates within 5% of the best score: the one that starts soonest wins
SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "blocks": "GGUF blocks"}
MEMORY_BUDGET_GIB = 2.5  # the worker, both engines and its imports: the default (service/config.py)
FALLBACK = ("float32", True)  # no profile, no faithful row: slow is acceptable, unfaithful is not


def faithful(row: dict) -> bool:
    return row.get("status") == "measured" and row.get("prefix", 0) >= MIN_PREFIX and bool(row.get("france"))


def ruled_out(row: dict) -> bool:
    """Its answers were measured and missed the bar (in full, or stopped once out of reach), or it
    was not run for its eager row's: measuring it again cannot make it eligible. A row the budget
    or its cap cut short is not ruled out."""
    status = row.get("status", "")
    measured_unfaithful = status == "measured" and not faithful(row)
    return measured_unfaithful or status.startswith("not faithful") or status.endswith("was not faithful")


def scores(rows: list[dict]) -> list[float]:
    """Each row's weighted time, every size's seconds divided by the fastest row's at that size:
    1.0 is fastest at every size; lower is better."""
    if not rows:
        return []
    sizes = [n for n in WEIGHTS if all(n in row.get("speed", {}) for row in rows)]
    total = sum(WEIGHTS[n] for n in sizes) or 1.0
    best = {n: min(row["speed"][n] for row in rows) or 1e-9 for n in sizes}
    return [sum(WEIGHTS[n] * row["speed"][n] / best[n] for n in sizes) / total for row in rows]


def label(row: dict) -> str:
    return f"{row['engine']} {row['dtype']} {'eager' if row['eager'] else 'compiled'}"


def _france(row: dict) -> str:
    """France right (faithful rows only get here), or no bar to judge by (fidelity.france_right)."""
    return "France right" if row.get("france_bar", True) else "France n/a (the reference does not say Paris)"


def describe(row: dict) -> str:
    speed = "/".join(f"{row['speed'][n]:.2f}" for n in WEIGHTS if n in row.get("speed", {}))
    sizes = "/".join(n for n in WEIGHTS if n in row.get("speed", {}))
    return (
        f"{label(row)}: {row['exact']}/{row['of']} exact, prefix {row['prefix']:.2f}, {_france(row)}, "
        f"{sizes} prompts {speed} s, start {warm_start(row):.0f} s"
        + (f", {row['memory_mib']} MiB" if "memory_mib" in row else "")
    )


def stored(row: dict) -> bool:
    """Whether a later start loads this row's graphs rather than compiling them again, as the row
    says: every form on a CPU does (vLLM's from its cache, the static engine's: batcher/static/graphs.py)."""
    return row["eager"] or row.get("stored", True)


def best_to_compile(rows: list[dict], engine: str) -> dict | None:
    """`engine`'s fastest faithful eager row: the one whose compiled form `auto` would take."""
    return choose(rows, engine, eager=True)[0]


def warm_start(row: dict) -> float:
    """Seconds a later start takes (measured before the profile did: this start's, its compile in it)."""
    return row.get("warm_start_s", row.get("start_s") or 0)


def choose(
    rows: list[dict], engine: str, dtype: str | None = None, eager: bool | None = None, room_mib: float | None = None
) -> tuple:
    """(the row `engine` should run, why), or (None, why) when no measured row is faithful, or
    none of them may run: with `eager` auto (None) a compiled row only where a later start loads
    its graphs; a row only where it holds at most `room_mib` (None: no bound; see `room`).
    `dtype` / `eager`: set explicitly, so only rows with that value compete."""
    mine = [r for r in rows if r["engine"] == engine and dtype in (None, r["dtype"]) and eager in (None, r["eager"])]
    eligible = [r for r in mine if faithful(r)]
    if not eligible:
        return None, f"none of {len(mine)} {engine} candidates measured faithful"
    recompiled = [r for r in eligible if eager is None and not stored(r)]
    over = [r for r in eligible if r not in recompiled and room_mib is not None and r.get("memory_mib", 0) > room_mib]
    kept = [r for r in eligible if r not in recompiled and r not in over]
    passed = [f"{len(recompiled)} compiled again at every start"] if recompiled else []
    passed += [f"{len(over)} over the {room_mib:.0f} MiB that MEMORY_BUDGET_GIB leaves it"] if over else []
    if not kept:
        return None, f"none of {len(eligible)} faithful {engine} candidates may run ({', '.join(passed)})"
    ranked = sorted(zip(scores(kept), kept, strict=True), key=lambda pair: pair[0])
    near = [row for score, row in ranked if score <= ranked[0][0] * NEAR]
    row = min(near, key=warm_start)
    passed_over = f"; passed over: {', '.join(passed)}" if passed else ""
    return row, f"{describe(row)} (fastest of {len(kept)} faithful{passed_over})"


def room(profile: dict, engine: str, budget_mib: float, beside) -> float | None:
    """The MiB `engine`'s row may hold in a worker within `budget_mib`: less the profile's base
    (the imports) and the other engine's share, `beside`: its row's (dtype, eager) as resolved,
    "least": the least any of its faithful rows holds (vLLM is resolved first, keeping that for
    the static engine, which then takes what vLLM's row leaves), None: no other engine
    (VLLM_ENABLED=0). None (no bound) for a profile that measured no memory."""
    if not profile.get("base_mib"):
        return None
    other = {"static": "vllm", "vllm": "static"}[engine]
    theirs = [r for r in profile["rows"] if r["engine"] == other and faithful(r) and "memory_mib" in r]
    if beside == "least":
        share = min((r["memory_mib"] for r in theirs), default=0)
    else:
        share = next((r["memory_mib"] for r in theirs if beside == (r["dtype"], r["eager"])), 0)
    return budget_mib - profile["base_mib"] - share


def resolve(
    profile: dict | None, engine: str, dtype: str, eager: bool | None, room_mib: float | None = None
) -> tuple[str, bool, str]:
    """(dtype, eager, reason) for `engine`: `dtype` "auto" or a name; `eager` None (auto) or set.
    An explicit value wins; the rest comes from the profile (within `room_mib`: `choose`), or is
    fp32 eager without one."""
    explicit = dtype != "auto", eager is not None
    dtype_set, eager_set = (dtype if explicit[0] else None), eager
    if all(explicit):
        return dtype, eager, "set explicitly"
    fallback = (dtype_set or FALLBACK[0], FALLBACK[1] if eager_set is None else eager_set)
    if profile is None:
        return (*fallback, f"no profile: {_short(*fallback)}")
    when = f"profile {profile.get('measured_at', '?')}"
    if profile.get("reference") != "measured":
        reference = profile.get("reference")
        return (*fallback, f"{when}: the fp32 eager reference was not measured ({reference}): {_short(*fallback)}")
    row, why = choose(profile["rows"], engine, dtype_set, eager_set, room_mib)
    if row is None:
        return (*fallback, f"{when}: {why}: {_short(*fallback)}")
    return row["dtype"], row["eager"], f"{when}: {why}"


def _short(dtype: str, eager: bool) -> str:
    """("float32", True) -> "fp32 eager"."""
    return f"{SHORT.get(dtype, dtype)} {'eager' if eager else 'compiled'}"
