"""Benchmark the service: no batching (/basic_generate), static batching (/generate) and continuous
batching (/generate_vllm) against the number of prompts N, two ways (one request carrying N
prompts; N concurrent single-prompt requests), plus the bare-library baselines and a BATCH_SIZE
sweep. Starts the real service under gunicorn (or targets --url), prints markdown tables and
targets, writes JSON and a PNG plot.

    python -m bench                      # the full run (~10-15 min on 2 CPU cores)
    python -m bench --no-vllm --n 1,4 --repeats 1 --no-sweep --no-offline --no-direct   # smoke
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import requests

from bench import fidelity, measure, report, serve_client, startup
from bench.server import Server
from service.config import Config

RESULTS = Path(__file__).resolve().parent / "results"
SWEEP_N = 64
# the service waits as long as our requests do, so a slow shared machine makes slow numbers, not 504s
SERVICE_ENV = {"REQUEST_TIMEOUT_S": str(measure.TIMEOUT_S)}


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of positive integers, got {text!r}")
    return values


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="benchmark a running service (no restart: no sweep)")
    p.add_argument("--n", type=_ints, default=[1, 4, 16, 64], help="prompt counts N (default 1,4,16,64)")
    p.add_argument("--repeats", type=int, default=3, help="repeats per cell; median and min-max (default 3)")
    p.add_argument("--basic-max-n", type=int, default=16, help="/basic_generate cells above this N run once")
    service = Config.from_env()  # the service's own settings, so the defaults cannot drift from them
    p.add_argument("--batch-size", type=int, default=service.batch_size, help="BATCH_SIZE (default: the service's)")
    p.add_argument("--max-tokens", type=int, default=service.max_new_tokens, help="max_tokens per prompt, greedy")
    p.add_argument("--sweep", type=_ints, default=[1, 2, 4, 8, 16, 64], help="BATCH_SIZE values for the sweep")
    p.add_argument("--no-sweep", action="store_true", help="skip the BATCH_SIZE sweep")
    p.add_argument("--no-vllm", action="store_true", help="start the service with VLLM_ENABLED=0 (fast)")
    p.add_argument("--no-offline", action="store_true", help="skip the offline vLLM LLM.generate() baseline")
    p.add_argument("--no-direct", action="store_true", help="skip the direct model.generate() baseline")
    p.add_argument("--no-openai", action="store_true", help="skip the OpenAI-route runs (bench.serve_client)")
    p.add_argument("--no-fidelity", action="store_true", help="skip the fidelity table (bench.fidelity)")
    p.add_argument("--no-startup", action="store_true", help="skip cold and warm start-up times (bench.startup)")
    p.add_argument("--ready-timeout", type=float, default=300, help="seconds to wait for the engines (default 300)")
    p.add_argument("--out", type=Path, default=RESULTS, help="where the JSON and PNG go (default bench/results)")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.batch_size < 1:
        p.error("--repeats and --batch-size must be >= 1")
    return args


def warm_up(url: str, paths: dict[str, str], args: argparse.Namespace) -> None:
    prompts = measure.make_prompts(args.batch_size)
    for path in paths.values():
        measure.one_request(url, path, prompts, args.max_tokens)
        measure.concurrent(url, path, prompts, args.max_tokens)
    measure.sequential_basic(url, prompts[:1], args.max_tokens)


def measure_grid(url: str, paths: dict[str, str], args: argparse.Namespace) -> list[dict]:
    cells, mt, reps = [], args.max_tokens, args.repeats
    for n in args.n:
        prompts = measure.make_prompts(n)
        for name, path in paths.items():
            cells.append(measure.cell(name, "one", n, reps, partial(measure.one_request, url, path, prompts, mt)))
            cells.append(measure.cell(name, "concurrent", n, reps, partial(measure.concurrent, url, path, prompts, mt)))
        basic = partial(measure.sequential_basic, url, prompts, mt)
        cells.append(measure.cell("basic", "sequential", n, reps if n <= args.basic_max_n else 1, basic))
    if args.batch_size not in args.n:  # the round time of the round model: one full round
        prompts = measure.make_prompts(args.batch_size)
        fn = partial(measure.one_request, url, "/generate", prompts, mt)
        cells.append(measure.cell("static", "round", args.batch_size, reps, fn))
    return cells


def service_phase(args: argparse.Namespace, res: dict, log_path: Path) -> None:
    env = {"BATCH_SIZE": str(args.batch_size), "VLLM_ENABLED": "0" if args.no_vllm else "1", **SERVICE_ENV}
    srv = Server(url=args.url) if args.url else Server(log_path, env)
    try:
        health = srv.wait_ready(args.ready_timeout)
        vllm = health["engines"]["vllm"]
        res["service"], res["vllm_ok"] = {"url": srv.url, "health": health}, vllm["status"] == "ready"
        if res["vllm_ok"]:
            print(f"service ready at {srv.url}; vLLM loaded in {vllm['load_seconds']:.0f} s", flush=True)
        else:
            res["notes"].append(f"vLLM engine {vllm['status']} ({vllm.get('error')}): static path benchmarked alone")
            print(f"service ready at {srv.url}; {res['notes'][-1]}", flush=True)
        paths = {"static": "/generate"} | ({"vllm": "/generate_vllm"} if res["vllm_ok"] else {})
        warm_up(srv.url, paths, args)
        res["cells"] = measure_grid(srv.url, paths, args)
        res["memory"] = {"peak_gib": srv.health().get("peak_memory_gib")}  # the service's own reading
        if not args.no_openai:
            openai_phase(srv.url, res, args)
    finally:
        srv.stop()


def openai_phase(url: str, res: dict, args: argparse.Namespace) -> None:
    """The OpenAI routes: their cost over the demo route on one 64-prompt request, and vLLM's own
    benchmark client (`vllm bench serve`) against each engine's base URL."""
    model = requests.get(f"{url}/v1/models", timeout=30).json()["data"][0] if res["vllm_ok"] else None
    engines = ["static", "vllm"] if res["vllm_ok"] else []  # the client fetches nothing: needs the id
    if res["vllm_ok"]:
        res["openai_overhead"] = serve_client.openai_overhead(url, measure.make_prompts(SWEEP_N), args.max_tokens, 3)
        print(f"  /v1/completions vs /generate_vllm, {SWEEP_N} prompts: {res['openai_overhead']['ratio']:.3f}x")
    res["vllm_bench_serve"] = {}
    for engine in engines:
        result = serve_client.run(url, engine, model["root"], model["id"], output_len=args.max_tokens)
        res["vllm_bench_serve"][engine] = serve_client.summary(result)
        print(f"  vllm bench serve, {engine}: {res['vllm_bench_serve'][engine]}", flush=True)


def baseline_phase(args: argparse.Namespace, res: dict, log_path: Path) -> None:
    """In-process baselines, each in its own subprocess, after the service is gone."""
    jobs = []
    if not args.no_direct:
        jobs.append(("direct", measure.make_prompts(args.batch_size)))
    if not args.no_offline and res["vllm_ok"]:
        jobs.append(("offline", measure.make_prompts(max(args.n))))
    elif not args.no_offline:
        res["notes"].append("offline vLLM baseline skipped: the service's vLLM engine was not ready")
    for kind, prompts in jobs:
        print(f"{kind} baseline on {len(prompts)} prompts (subprocess)...", flush=True)
        try:
            res[kind] = measure.run_baseline(kind, prompts, args.repeats, args.max_tokens, log_path)
        except (subprocess.SubprocessError, OSError, ValueError, KeyError) as exc:
            res["notes"].append(f"{kind} baseline failed: {exc} (log: {log_path})")
            continue
        print(f"  {kind}: {res[kind]['median']:.3f} s [{res[kind]['min']:.3f}-{res[kind]['max']:.3f}]", flush=True)


def sweep_phase(args: argparse.Namespace, res: dict, log_path: Path) -> None:
    """One SWEEP_N-prompt /generate request per BATCH_SIZE, each on a fresh static-only service."""
    if args.url:
        res["notes"].append("batch-size sweep skipped: a --url service cannot be restarted")
        return
    prompts = measure.make_prompts(SWEEP_N)
    for bs in args.sweep:
        srv = Server(log_path, {"BATCH_SIZE": str(bs), "VLLM_ENABLED": "0", **SERVICE_ENV})
        try:
            srv.wait_ready(args.ready_timeout)
            measure.one_request(srv.url, "/generate", prompts[: min(bs, 4)], args.max_tokens)  # warm-up
            run = measure.one_request(srv.url, "/generate", prompts, args.max_tokens)
        finally:
            srv.stop()
        row = report.sweep_row(bs, run.seconds, run.rounds, run.latencies_ms)
        print(f"  sweep BATCH_SIZE={bs:<3} {run.seconds:7.2f} s  {row['req_per_s']:.1f} req/s", flush=True)
        res["sweep"].append(row)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    log_path = Path(tempfile.gettempdir()) / f"bench-{stamp}.log"
    config = {**vars(args), "out": str(args.out), "log": str(log_path)}
    res = {"timestamp": stamp, "config": config, "machine": report.machine(), "notes": [], "cells": [], "sweep": []}
    res["vllm_ok"], res["machine"]["loadavg_start"] = False, os.getloadavg()
    if os.getloadavg()[0] > 0.5:
        res["notes"].append(f"load average {os.getloadavg()[0]:.1f} at start: other processes share the CPUs")
    if args.basic_max_n < max(args.n):
        res["notes"].append(f"/basic_generate cells with N > {args.basic_max_n} ran once (--basic-max-n)")
    print(f"bench {stamp}: N={args.n} repeats={args.repeats} BATCH_SIZE={args.batch_size}; log: {log_path}", flush=True)
    try:
        service_phase(args, res, log_path)
        baseline_phase(args, res, log_path)
        if not args.no_sweep:
            sweep_phase(args, res, log_path)
        if not args.no_fidelity:
            res["fidelity"] = fidelity.measure_all(log_path)
        if not args.no_startup and not args.url:
            res["startup"] = startup.cold_and_warm({}, log_path)
    except (OSError, RuntimeError) as exc:  # requests' errors and TimeoutError are OSErrors
        print(f"bench failed: {exc}\n(service log: {log_path})", file=sys.stderr)
        return 1
    res["round_model"] = report.round_model(res)
    res["targets"] = report.targets(res)
    res["elapsed_s"], res["machine"]["loadavg_end"] = time.monotonic() - started, os.getloadavg()
    json_path, png_path = report.write(res, args.out)
    print()
    report.print_report(res)
    if res.get("vllm_bench_serve"):
        print("\n### OpenAI routes\n\n" + "\n".join(serve_client.table(res)))
    for title, key, table in (("Fidelity", "fidelity", fidelity.table), ("Start-up", "startup", startup.table)):
        if res.get(key):
            print(f"\n### {title}\n\n" + "\n".join(table(res[key])))
    also = f" and {png_path}" if png_path else ""
    print(f"\nwrote {json_path}{also} (copied to latest.*); {res['elapsed_s']:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
