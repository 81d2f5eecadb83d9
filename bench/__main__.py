"""Benchmark the service: no batching (/basic_generate), static batching (/generate) and continuous
batching (/generate_vllm) against N prompts, as one request carrying N and as N concurrent
requests; the time to first token; the bare-library baselines; with --full also the OpenAI routes
under vLLM's own client, a BATCH_SIZE sweep, fidelity and start-up. Starts the real service under
gunicorn (or targets --url), prints markdown tables and targets, writes JSON and a PNG plot.

    python -m bench               # quick: N=1,4,16, one repeat (under 8 min on 2 idle CPU cores)
    python -m bench --full        # every phase, N=1,4,16,64, 3 repeats (about an hour)
    python -m bench --no-vllm --n 1,4 --skip ttft,direct,offline   # smoke
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from bench import fidelity, inproc, measure, report, serve_client, startup
from bench.server import Server
from service.config import Config

RESULTS = Path(__file__).resolve().parent / "results"
SWEEP_N, SWEEP, BASIC_MAX_N, READY_TIMEOUT_S = 64, [1, 2, 4, 8, 16, 64], 16, 300
PHASES = ("grid", "ttft", "openai", "direct", "offline", "sweep", "fidelity", "startup")
QUICK = {"n": [1, 4, 16], "repeats": 1, "phases": ("grid", "ttft", "direct", "offline")}
FULL = {"n": [1, 4, 16, 64], "repeats": 3, "phases": PHASES}
# the service waits as long as our requests do, so a slow shared machine makes slow numbers, not 504s
SERVICE_ENV = {"REQUEST_TIMEOUT_S": str(measure.TIMEOUT_S)}
PATHS = {"static": "/generate", "vllm": "/generate_vllm"}


def _csv(kind, text: str) -> list:
    values = text.split(",")
    if not all(v in PHASES if kind is str else v.isdigit() and int(v) > 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list ({'phases' if kind is str else 'N > 0'})")
    return [kind(v) for v in values]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    service = Config.from_env()  # the service's own settings, so the defaults cannot drift from them
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--full", action="store_true", help=f"every phase, N={FULL['n']}, {FULL['repeats']} repeats")
    p.add_argument("--url", help="benchmark a running service (no restart: no sweep, no start-up)")
    p.add_argument("--n", type=partial(_csv, int), help=f"prompt counts N (default {QUICK['n']}; --full {FULL['n']})")
    p.add_argument("--repeats", type=int, help="repeats per cell; median and min-max (default 1; --full 3)")
    p.add_argument("--skip", type=partial(_csv, str), default=[], help=f"phases to skip, of {','.join(PHASES)}")
    p.add_argument("--batch-size", type=int, default=service.batch_size, help="BATCH_SIZE (default: the service's)")
    p.add_argument("--max-tokens", type=int, default=service.max_new_tokens, help="max_tokens per prompt, greedy")
    p.add_argument("--no-vllm", action="store_true", help="start the service with VLLM_ENABLED=0 (fast)")
    p.add_argument("--out", type=Path, default=RESULTS, help="where the JSON and PNG go (default bench/results)")
    args = p.parse_args(argv)
    run = FULL if args.full else QUICK
    args.n, args.repeats = args.n or run["n"], args.repeats or run["repeats"]
    restarts = ("sweep", "startup") if args.url else ()  # a service someone else runs cannot be restarted
    args.phases = [name for name in run["phases"] if name not in args.skip and name not in restarts]
    if args.repeats < 1 or args.batch_size < 1:
        p.error("--repeats and --batch-size must be >= 1")
    return args


@contextlib.contextmanager
def phase(res: dict, name: str, *, fatal: bool = False):
    """Time a phase; one that fails is noted, and the others still run (unless `fatal`)."""
    started = time.monotonic()
    print(f"--- {name}", flush=True)
    try:
        yield
    except (OSError, RuntimeError, ValueError, KeyError, subprocess.SubprocessError) as exc:
        if fatal:
            raise
        res["notes"].append(f"{name} failed: {str(exc)[:500]} (log: {res['config']['log']})")
    finally:
        res["phase_s"][name] = time.monotonic() - started
        print(f"--- {name}: {res['phase_s'][name]:.0f} s", flush=True)


def grid(srv: Server, engines: list[str], args: argparse.Namespace, res: dict) -> None:
    url, mt, reps, warm = srv.url, args.max_tokens, args.repeats, measure.make_prompts(args.batch_size)
    for engine in engines:
        measure.one_request(url, PATHS[engine], warm, mt), measure.concurrent(url, PATHS[engine], warm, mt)
    measure.sequential_basic(url, warm[:1], mt)
    for n in args.n:
        prompts = measure.make_prompts(n)
        for engine in engines:
            for method, fn in (("one", measure.one_request), ("concurrent", measure.concurrent)):
                res["cells"].append(measure.cell(engine, method, n, reps, partial(fn, url, PATHS[engine], prompts, mt)))
        basic = partial(measure.sequential_basic, url, prompts, mt)
        res["cells"].append(measure.cell("basic", "sequential", n, reps if n <= BASIC_MAX_N else 1, basic))
    if args.batch_size not in args.n:  # the round time of the round model: one full round
        fn = partial(measure.one_request, url, "/generate", measure.make_prompts(args.batch_size), mt)
        res["cells"].append(measure.cell("static", "round", args.batch_size, reps, fn))
    res["memory"] = {"peak_gib": srv.health().get("peak_memory_gib")}  # the service's own reading


def openai(srv: Server, engines: list[str], args: argparse.Namespace, res: dict) -> None:
    """The OpenAI layer's cost on one request of SWEEP_N prompts, and vLLM's own client per engine."""
    res["openai_overhead"] = serve_client.openai_overhead(srv.url, measure.make_prompts(SWEEP_N), args.max_tokens, 3)
    run = partial(serve_client.run, num_prompts=SWEEP_N, output_len=args.max_tokens)
    res["vllm_bench_serve"] = {e: serve_client.summary(run(srv.url, e, *serve_client.model(srv.url))) for e in engines}


def on_the_service(args: argparse.Namespace, res: dict, log_path: Path) -> None:
    env = {"BATCH_SIZE": str(args.batch_size), "VLLM_ENABLED": "0" if args.no_vllm else "1", **SERVICE_ENV}
    srv = Server(url=args.url) if args.url else Server(log_path, env)
    try:
        with phase(res, "start", fatal=True):
            vllm = srv.wait_ready(READY_TIMEOUT_S)["engines"]["vllm"]
        res["service"], res["vllm_ok"] = {"url": srv.url, "vllm": vllm}, vllm["status"] == "ready"
        if not res["vllm_ok"]:
            res["notes"].append(f"vLLM engine {vllm['status']} ({vllm.get('error')}): static path benchmarked alone")
        engines = ["static", "vllm"] if res["vllm_ok"] else ["static"]
        ttft = lambda srv, engines, args, res: res.update(ttft={e: measure.ttft(srv, e, 3) for e in engines})  # noqa: E731
        for name, fn in (("grid", grid), ("ttft", ttft), ("openai", openai)):
            if name in args.phases and (name != "openai" or res["vllm_ok"]):
                with phase(res, name):
                    fn(srv, engines, args, res)
    finally:
        srv.stop()


def baseline(kind: str, args: argparse.Namespace, res: dict, log_path: Path) -> None:
    """In its own process, after the service is gone: transformers' model.generate() (and the
    service's Runner) on one round ("direct"), or offline vLLM on the largest N ("offline")."""
    if kind == "offline" and not res["vllm_ok"]:
        return res["notes"].append("offline vLLM baseline skipped: the service's vLLM engine was not ready")
    prompts = measure.make_prompts(args.batch_size if kind == "direct" else max(args.n))
    spec = dict(engine={"direct": "static", "offline": "vllm"}[kind], dtype=Config.from_env().dtype, bare=True,
                eager=res["service"]["vllm"].get("eager", True) if kind == "offline" else True, timed=[prompts],
                timed_tokens=args.max_tokens, repeats=args.repeats, round=args.batch_size)  # fmt: skip
    with open(log_path, "a") as log:
        out = inproc.run(spec, log)
    res[kind] = {"dtype": out["dtype"], "n": len(prompts), **measure.summarize(out.get("bare_runs", out["runs"])[0])}
    if kind == "direct":
        res[kind]["runner_generate"] = measure.summarize(out["runs"][0])


def sweep(args: argparse.Namespace, res: dict, log_path: Path) -> None:
    """One SWEEP_N-prompt /generate request per BATCH_SIZE, each on a fresh static-only service."""
    prompts = measure.make_prompts(SWEEP_N)
    for bs in SWEEP:
        srv = Server(log_path, {"BATCH_SIZE": str(bs), "VLLM_ENABLED": "0", **SERVICE_ENV})
        try:
            srv.wait_ready(READY_TIMEOUT_S)
            measure.one_request(srv.url, "/generate", prompts[: min(bs, 4)], args.max_tokens)  # warm-up
            run = measure.one_request(srv.url, "/generate", prompts, args.max_tokens)
        finally:
            srv.stop()
        res["sweep"].append(report.sweep_row(bs, run.seconds, run.rounds, run.latencies_ms))


LATER = {  # after the service has stopped, each in its own processes
    "direct": partial(baseline, "direct"),
    "offline": partial(baseline, "offline"),
    "sweep": sweep,
    "fidelity": lambda args, res, log_path: res.update(fidelity=fidelity.measure_all(log_path)),
    "startup": lambda args, res, log_path: res.update(startup=startup.cold_and_warm({}, log_path)),
}


def main(argv: list[str] | None = None) -> int:
    args, started, stamp = parse_args(argv), time.monotonic(), datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    log_path = Path(tempfile.gettempdir()) / f"bench-{stamp}.log"
    config = {**vars(args), "out": str(args.out), "log": str(log_path), "basic_max_n": BASIC_MAX_N}
    res = dict(timestamp=stamp, config=config, machine=report.machine(), notes=[], cells=[], sweep=[], phase_s={})
    res["vllm_ok"], res["machine"]["loadavg_start"] = False, os.getloadavg()
    if os.getloadavg()[0] > 0.5:
        res["notes"].append(f"load average {os.getloadavg()[0]:.1f} at start: other processes share the CPUs")
    print(f"bench {stamp}: N={args.n} repeats={args.repeats} phases={args.phases}; log: {log_path}", flush=True)
    try:
        on_the_service(args, res, log_path)
    except (OSError, RuntimeError) as exc:  # requests' errors and TimeoutError are OSErrors
        print(f"bench failed: {exc}\n(service log: {log_path})", file=sys.stderr)
        return 1
    for name in (name for name in args.phases if name in LATER):
        with phase(res, name):
            LATER[name](args, res, log_path)
    res["round_model"] = report.round_model(res)
    res["targets"] = report.targets(res)
    res["elapsed_s"], res["machine"]["loadavg_end"] = time.monotonic() - started, os.getloadavg()
    json_path, png_path = report.write(res, args.out)
    lines = report.lines(res)
    extra = {"OpenAI routes": (serve_client.table, "vllm_bench_serve"), "Fidelity": (fidelity.table, "fidelity"),
             "Start-up": (startup.table, "startup")}  # fmt: skip
    for title, (table, key) in extra.items():
        lines += [f"### {title}", "", *table(res if key == "vllm_bench_serve" else res[key]), ""] if key in res else []
    phases = [[name, f"{seconds:.0f}"] for name, seconds in res["phase_s"].items()]
    print("\n" + "\n".join(lines + report.table("Phases", ["phase", "wall time (s)"], phases)))
    print(
        f"wrote {json_path}{' and ' + str(png_path) if png_path else ''} (copied to latest.*); {res['elapsed_s']:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
