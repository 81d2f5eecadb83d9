"""The soak's verdict: its table's rows, the counts the smoke test checks, and why it failed, if it did."""

from __future__ import annotations

from pathlib import Path

import psutil

from bench.soak_load import HOGS, LOAD_FACTOR, MAX_IN_FLIGHT, QUIET_S, Load
from bench.soak_watch import HEALTH_LIMIT_S, Watch

FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile")  # what decides the machine profile


def failures(load: Load, recovery: tuple, watch: Watch) -> list[str]:
    """Why the soak failed: each line one of the four rules of bench/soak.py's docstring broken."""
    lost = sum(n for k, n in load.outcomes.items() if k.startswith("LOST"))
    bare = sum(n for k, n in load.outcomes.items() if k.startswith("FAIL"))
    out = [f"{lost} of {load.sent} requests lost or unanswered"] if lost else []
    out += [f"{bare} refusals without a reason or Retry-After"] if bare else []
    for label in sorted(watch.ruled):
        if watch.missed[label] or watch.latency[label] > HEALTH_LIMIT_S:
            out.append(
                f"{label} did not answer within {HEALTH_LIMIT_S:g} s in {watch.missed[label]} of "
                f"{watch.polls[label]} polls (max {watch.latency[label]:.2f} s)"
            )
    if recovery[0] is None:
        out.append(f"no ordinary request admitted within the {QUIET_S:g} s quiet spell ({recovery[2]} tried)")
    return out


def cpu_detail() -> str:
    """What the model name leaves out ("AMD EPYC" names a Zen 3 and a Zen 4 alike): family, model, vector flags."""
    info = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().splitlines() if ":" in line)
    info = {k.strip(): v.strip() for k, v in info.items()}
    flags = [f for f in FLAGS if f in info.get("flags", "").split()]
    return f"{psutil.cpu_count()} cores; family {info.get('cpu family')}, model {info.get('model')}; {' '.join(flags)}"


def _at(watch: Watch, seconds: list[float]) -> str:
    """When the late polls were sent, seconds into the watch, and the CPU time the hypervisor
    took around each: " (sent at 63 s: steal 0.9 CPU-s)", or ""."""
    late = [f"{s:.0f} s: steal {watch.steal_near(s):.1f} CPU-s" for s in seconds]
    return f" (sent at {'; '.join(late)})" if late else ""


def _trio(values: tuple, fmt: str) -> str:
    return " / ".join("-" if v is None else fmt.format(v) for v in values)


def verdict(cpu: str, seconds: float, rate: float, skipped: list[str], load: Load, recovery: tuple, watch, ends):
    """The table's rows, the counts the smoke test checks, and the failures, if any."""
    why = failures(load, recovery, watch)
    admitted, answered, tries = recovery
    before, after = (e or (None, None) for e in ends)
    peak = [max((s[i] for s in watch.samples), default=None) for i in (0, 1)]
    rows = [
        ("CPU", cpu, f"{cpu_detail()}; steal {watch.steal:.1f} CPU-s over the soak (the hypervisor's)"),
        ("offered (req/s)", round(rate, 2), f"Poisson, {LOAD_FACTOR}x the capacity measured just before"),
        ("load (s)", round(seconds), "; ".join([f"from {watch.load_at:.0f} s into the watch",
                                                 f"{HOGS} CPU-spinning processes for its middle third", *skipped])),
        ("requests sent", load.sent, f"{sum(load.outcomes.values())} accounted for"),
        *((k, n, load.examples.get(k, "")[:90]) for k, n in sorted(load.outcomes.items())),
        *([("not sent: client at its cap", load.not_sent, f"{MAX_IN_FLIGHT} in flight")] if load.not_sent else []),
        ("recovery (s)", "-" if admitted is None else round(admitted, 1),
         f"{tries} tries, one at a time; the admitted one answered at {answered:.1f} s"),
        ("worker RSS (MiB) before / peak / after", _trio((before[0], peak[0], after[0]), "{:.0f}"),
         f"worker pids seen: {len(watch.pids)}"),
        ("worker threads before / peak / after", _trio((before[1], peak[1], after[1]), "{:d}"), ""),
        *((f"{p} max latency (ms)", round(1000 * s), f"{watch.polls[p]} polls, 1/s: {watch.missed[p]} over "
           f"{HEALTH_LIMIT_S:g} s or unanswered{_at(watch, watch.late[p])}, {watch.not_ok[p]} not 200"
           f"{'' if p in watch.ruled else '; shown, not ruled'}")
          for p, s in watch.latency.items()),
        ("verdict", "FAIL" if why else "PASS", "; ".join(why)),
    ]  # fmt: skip
    return {
        "soak": [{"what": w, "value": v, "detail": str(d).replace("\n", " ")} for w, v, d in rows],
        "soak_counts": {"sent": load.sent, "outcomes": dict(load.outcomes), "not_sent": load.not_sent},
        "soak_failures": why,
        "soak_verdict": "FAIL" if why else "PASS",
    }
