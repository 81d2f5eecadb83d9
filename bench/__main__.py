"""Benchmark the service under gunicorn, phase by phase (docs/performance.md); print markdown
tables, write JSON. `python -m bench` (quick: N=1 4 16, one repeat; under 8 min on 2 busy cores),
`--full` (every phase, N=1 4 16 64, 3 repeats; about an hour), `--only PHASE ...`, `--skip PHASE ...`;
`--only soak` (minutes of overload, bench/soak.py) and `--only batch` (the Batch API beside vLLM's
run_batch, bench/batch.py) run only when asked."""

import argparse
import os
import sys
import time
from pathlib import Path

from bench import batch, report
from bench.phases import ASKED, FULL, QUICK, Bench
from deploy.server import ROOT
from service.config import Config


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    service = Config.from_env()  # the service's own settings, so the defaults cannot drift from them
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    phases = dict(nargs="+", choices=FULL["phases"] + ASKED, metavar="PHASE")
    p.add_argument("--full", action="store_true", help=f"every phase, N={FULL['n']}, {FULL['repeats']} repeats")
    p.add_argument("--only", **phases, help=f"these phases alone, of {' '.join(FULL['phases'] + ASKED)}")
    p.add_argument("--skip", **phases, default=[], help="phases to leave out")
    p.add_argument("--n", nargs="+", type=int, help=f"prompt counts N (default {QUICK['n']}; --full {FULL['n']})")
    p.add_argument("--repeats", type=int, help="repeats per cell; median and min-max (default 1; --full 3)")
    p.add_argument("--batch-size", type=int, default=service.batch_size, help="BATCH_SIZE (default: the service's)")
    p.add_argument("--max-tokens", type=int, default=service.max_new_tokens, help="max_tokens per prompt, greedy")
    p.add_argument("--no-vllm", action="store_true", help="start the service with VLLM_ENABLED=0 (fast)")
    p.add_argument("--url", help="measure the service running there (no API key; its BATCH_SIZE --batch-size's)")
    p.add_argument("--soak-seconds", type=float, default=180, help="soak: seconds of 3x overload (default 180)")
    p.add_argument("--batch-lines", type=int, default=batch.LINES, help=f"batch: lines (default {batch.LINES})")
    p.add_argument("--probe-url", help="soak with --url: its probe server (PROBE_PORT), held to the 1 s rule")
    p.add_argument("--llama-server", type=Path, help="peers: llama.cpp's llama-server, built in its source tree")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="where the JSON goes")
    args = p.parse_args(argv)
    run = FULL if args.full else QUICK
    args.n, args.repeats = args.n or run["n"], args.repeats or run["repeats"]
    args.phases = [name for name in FULL["phases"] + ASKED if name in set(args.only or run["phases"]) - set(args.skip)]
    if args.url and args.no_vllm:
        p.error("--no-vllm sets up the service it starts; with --url it is already running")
    if min(args.repeats, args.batch_size, *args.n) < 1:
        p.error("--n, --repeats and --batch-size must be >= 1")
    if args.batch_lines < 1:
        p.error("--batch-lines must be >= 1")
    if args.soak_seconds <= 0:
        p.error("--soak-seconds must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    bench, started = Bench(parse_args(argv)), time.monotonic()
    print(f"bench: {bench.args.phases}, N={bench.args.n}, {bench.args.repeats} repeats; log: {bench.log_path}")
    try:
        bench.run()
    except (OSError, RuntimeError) as exc:  # requests' errors and TimeoutError are OSErrors
        print(f"bench failed: {exc}\n(service log: {bench.log_path})", file=sys.stderr)
        return 1
    bench.res.update(elapsed_s=time.monotonic() - started, loadavg_end=os.getloadavg())
    path = report.write(bench.res, bench.args.out)
    print("\n" + "\n".join(report.lines(bench.res)))
    print(f"wrote {path} (copied to latest.json); {bench.res['elapsed_s']:.0f} s", flush=True)
    if "soak" in bench.args.phases and bench.res.get("soak_verdict") != "PASS":
        why = bench.res.get("soak_failures") or [n for n in bench.res["notes"] if n.startswith("soak")]
        print(f"soak FAILED: {'; '.join(why)}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
