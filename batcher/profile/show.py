"""The profile as a markdown table, and each engine's choice: for `python -m batcher.profile`
and the bench."""

from __future__ import annotations

from batcher.profile import choose, fidelity


def cells(row: dict) -> dict:
    """One row as the table shows it."""
    measured = "prefix" in row  # its fidelity, whole or up to where it stopped ("of" says how far)
    speed = row.get("speed", {})
    france = "yes" if row.get("france") else f"no: {row.get('france_text', '')}"
    if not row.get("france_bar", True):
        france = "n/a: the reference does not say Paris"
    return {
        "engine": row["engine"],
        "dtype": row["dtype"],
        "decoding": "eager" if row["eager"] else "compiled",
        "status": row.get("status", "?"),
        "exact": f"{row['exact']}/{row['of']}" if measured else "-",
        "agreeing prefix": f"{row['prefix']:.2f}" if measured else "-",
        "France -> Paris": france if measured else "-",
        "start (s)": row.get("start_s", "-"),
        "compile (s)": round(row["compile_s"], 1) if row.get("compile_s") else "-",
        "later start (s)": "compiles again"
        if "start_s" in row and not choose.stored(row)
        else row.get("warm_start_s", "-"),
        "memory (MiB)": row.get("memory_mib", "-"),
        **{f"{n} prompts (s)": speed.get(n, "-") for n in choose.WEIGHTS},
        "faithful": "yes" if choose.faithful(row) else "no",
    }


def markdown(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    head = list(rows[0])
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(str(row[name]) for name in head) + " |" for row in rows]


def lines(profile: dict | None) -> list[str]:
    """The table, the notes, and what `auto` resolves to per engine."""
    if profile is None:
        out = ["no profile for this machine (run `python -m batcher.profile --measure`, or `make setup`)"]
    else:
        cap = f", each candidate's cap {profile['cap_s']} s" if "cap_s" in profile else ""
        out = [f"measured {profile['measured_at']} in {profile['wall_s']} s (budget {profile['budget_s']:.0f} s{cap})"]
        out += markdown([cells(row) for row in profile["rows"]])
        out += [f"- fidelity prompts: {fidelity.FORMS[profile['prompts']]}"] if "prompts" in profile else []
        out += [f"- {note}" for note in profile.get("notes", [])]
        if profile.get("finished_at"):
            out.append(f"- compiled rows finished in the background: {profile['finished_at']}")
    if profile and profile.get("base_mib"):
        budget = f"MEMORY_BUDGET_GIB's default: {choose.MEMORY_BUDGET_GIB}"
        out.append(f"- a worker's imports: {profile['base_mib']} MiB ({budget})")
    budget, chosen = choose.MEMORY_BUDGET_GIB * 1024, {}
    for engine, beside in (("vllm", "least"), ("static", "vllm")):  # as service/config.py resolves them
        room = choose.room(profile, engine, budget, chosen.get(beside, beside)) if profile else None
        dtype, eager, reason = choose.resolve(profile, engine, "auto", None, room)
        chosen[engine] = (dtype, eager)
        out.append(f"{engine}: auto -> {choose.SHORT[dtype]} {'eager' if eager else 'compiled'} ({reason})")
    return out


def beside(stored: dict, fresh: dict) -> list[dict]:
    """Each candidate measured again in `fresh` beside its `stored` row: seconds at 1/4/64
    prompts, then and now; per engine, whether `auto`'s choice (by the stored profile) is, fresh,
    within 10% of the fastest faithful candidate's weighted time."""
    stored_rows = {choose.label(r): r for r in stored["rows"]}
    out = []
    for engine in ("static", "vllm"):
        dtype, eager, _ = choose.resolve(stored, engine, "auto", None)
        chosen = choose.label({"engine": engine, "dtype": dtype, "eager": eager})
        rows = [r for r in fresh["rows"] if r["engine"] == engine and r.get("status") == "measured"]
        faithful = [r for r in rows if choose.faithful(r)]
        # relative to the best row's score: no row need be the fastest at every size
        raw = choose.scores(faithful)
        score = {choose.label(r): value / min(raw, default=1) for r, value in zip(faithful, raw, strict=True)}
        for row in rows:
            then = stored_rows.get(choose.label(row), {}).get("speed", {})
            now = cells(row)
            out.append({
                "candidate": choose.label(row) + (" (auto's choice)" if choose.label(row) == chosen else ""),
                "stored 1/4/64 (s)": "/".join(str(then.get(n, "-")) for n in choose.WEIGHTS),
                "fresh 1/4/64 (s)": "/".join(str(row["speed"].get(n, "-")) for n in choose.WEIGHTS),
                "fresh: exact, prefix, France": f"{now['exact']}, {now['agreeing prefix']}, {now['France -> Paris']}",
                "fresh weighted time (1.0 = fastest faithful)": round(score[choose.label(row)], 3)
                if choose.label(row) in score else "not faithful",
                "within 10%": "yes" if score.get(choose.label(row), 9) <= 1.10 else "no",
            })  # fmt: skip
    return out
