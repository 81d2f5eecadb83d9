"""Benchmark the service under gunicorn, phase by phase (docs/performance.md); print markdown
tables, write JSON. `python -m bench` (quick: N=1 4 16, one repeat; under 8 min on 2 busy cores),
`--full` (every phase, N=1 4 16 64, 3 repeats; about an hour), `--only PHASE ...`, `--skip PHASE ...`;
`--only soak` (minutes of overload, bench/soak.py) runs only when asked."""

import argparse
import contextlib
import dataclasses
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from batcher.checkpoint import resolve_model
from batcher.profile import child, choose, show, store
from batcher.profile import measure as profiling
from bench import measure, peers, report, serve_client, soak, structured, wait
from deploy.server import ROOT, SETTLED, Server
from service.config import Config

SWEEP_N, SWEEP, BASIC_MAX_N, READY_TIMEOUT_S, STARTUP_TIMEOUT_S = 64, [1, 2, 4, 8, 16, 64], 16, 300, 1500
ON_THE_SERVICE = ("grid", "ttft", "structured", "openai", "wait")
LATER = ("direct", "offline", "sweep", "fidelity", "profile", "startup", "peers")  # the service stopped; own processes
ASKED = ("soak",)  # only in --only: minutes of overload, on a service of its own (or --url)
QUICK = {"n": [1, 4, 16], "repeats": 1, "phases": ("grid", "ttft", "structured", "direct", "offline")}
FULL = {"n": [1, 4, 16, 64], "repeats": 3, "phases": ON_THE_SERVICE + LATER}
# the service waits as long as our requests do, so a slow shared machine makes slow numbers, not 504s
SERVICE_ENV = {"REQUEST_TIMEOUT_S": str(measure.TIMEOUT_S)}


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
    if args.soak_seconds <= 0:
        p.error("--soak-seconds must be > 0")
    return args


class Bench:
    """One run: its settings, what it measures (`res`, written as JSON), its log, the service."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.srv, self.engines = args, None, ["static", "vllm"]
        stamp, load = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"), os.getloadavg()
        self.log_path = Path(tempfile.gettempdir()) / f"bench-{stamp}.log"
        config = {**vars(args), "out": str(args.out), "log": str(self.log_path)}
        machine = {**report.machine(), "loadavg_start": load}
        self.res = dict(timestamp=stamp, config=config, machine=machine, notes=[], cells=[], phases=[])
        if load[0] > 0.5:
            self.res["notes"].append(f"load average {load[0]:.1f} at start: other processes share the CPUs")

    def run(self) -> None:
        """The phases on the service, then, the service stopped, the others; each timed."""
        args, started = self.args, time.monotonic()
        if any(name in ON_THE_SERVICE for name in args.phases):
            env = {"BATCH_SIZE": str(args.batch_size), "VLLM_ENABLED": str(int(not args.no_vllm)), **SERVICE_ENV}
            self.srv = Server(self.log_path, env, url=args.url)
        with self.srv or contextlib.nullcontext():
            vllm = self.srv.wait_ready(READY_TIMEOUT_S)["engines"]["vllm"] if self.srv else {"status": "ready"}
            self.res["phases"].append({"phase": "start", "wall time (s)": round(time.monotonic() - started)})
            if vllm["status"] != "ready":
                self.engines = ["static"]
                self.res["notes"].append(f"vLLM engine {vllm['status']} ({vllm.get('error')}): static path alone")
            self.res["peak_memory_gib"] = self.srv and self.srv.health().get("peak_memory_gib")
            for name in (name for name in args.phases if name in ON_THE_SERVICE):
                self.phase(name)
        for name in (name for name in args.phases if name in LATER + ASKED):
            self.phase(name)

    def phase(self, name: str) -> None:
        """Run and time one phase; one that fails is noted, and the others still run."""
        started = time.monotonic()
        print(f"--- {name}", flush=True)
        try:
            if name in ("openai", "offline") and "vllm" not in self.engines:
                raise RuntimeError("skipped: the service's vLLM engine was not ready")
            self.baseline(name) if name in ("direct", "offline") else getattr(self, name)()
        except (OSError, RuntimeError, ValueError, KeyError, subprocess.SubprocessError) as exc:
            self.res["notes"].append(f"{name} failed: {str(exc)[:500]} (log: {self.log_path})")
        finally:
            self.res["phases"].append({"phase": name, "wall time (s)": round(time.monotonic() - started)})
            print(f"--- {name}: {self.res['phases'][-1]['wall time (s)']} s", flush=True)

    def grid(self) -> None:
        """Every path and method per N (a warm-up first); the round model reads its N=BATCH_SIZE cell."""
        url, mt, bs = self.srv.url, self.args.max_tokens, self.args.batch_size
        methods = [(engine, m) for engine in self.engines for m in ("one", "concurrent")] + [("basic", "sequential")]
        for engine, method in methods:
            measure.grid_run(url, engine, method, measure.make_prompts(1 if engine == "basic" else bs), mt)
        for n, (engine, method) in ((n, m) for n in self.args.n for m in methods):
            repeats = self.args.repeats if engine != "basic" or n <= BASIC_MAX_N else 1
            run = partial(measure.grid_run, url, engine, method, measure.make_prompts(n), mt)
            self.res["cells"].append(measure.cell(engine, method, n, repeats, run))

    def ttft(self) -> None:
        self.res["ttft"] = [measure.ttft(self.srv, engine, 3) for engine in self.engines]

    def structured(self) -> None:
        self.res["structured"] = [structured.cost(self.srv, engine, self.args.repeats) for engine in self.engines]
        self.res["tool_calls"] = [structured.cost(self.srv, e, self.args.repeats, "tool_call") for e in self.engines]
        self.res["grammar_compile"] = [structured.compile_cost(serve_client.model(self.srv.url)[0])]

    def wait(self) -> None:  # the predicted wait against the measured one, and admission by deadline
        self.res.update(wait.run(self.srv.url, self.engines, self.args.batch_size, self.args.max_tokens))

    def openai(self) -> None:  # vLLM's own client on each engine's OpenAI routes
        run = partial(serve_client.run, self.srv.url, num_prompts=SWEEP_N, output_len=self.args.max_tokens)
        model = serve_client.model(self.srv.url)
        self.res["vllm_bench_serve"] = [serve_client.row(engine, run(engine, *model)) for engine in self.engines]

    def baseline(self, name: str) -> None:
        """direct: transformers' model.generate() and the service's Runner on one round; offline: vLLM."""
        engine, names = ("static", [report.DIRECT, report.RUNNER]) if name == "direct" else ("vllm", [report.OFFLINE])
        prompts = measure.make_prompts(self.args.batch_size if name == "direct" else max(self.args.n))
        config = Config.from_env(batch_size=self.args.batch_size)
        settings = (config.static_engine if engine == "static" else config.vllm_engine)(self.model_path)
        spec = dict(engine=engine, settings=dataclasses.asdict(settings), bare=engine == "static")
        spec.update(timed=[prompts], timed_tokens=self.args.max_tokens, repeats=self.args.repeats)
        with open(self.log_path, "a") as log:
            out = child.run({**spec, "compile_cache_dir": config.compile_cache_dir}, log)
        for what, runs in zip(names, (*out.get("bare_runs", []), *out["runs"]), strict=True):
            median = round(statistics.median(runs), 3)
            row = {"what": what, "N": len(prompts), "dtype": out["dtype"], "median (s)": median}
            self.res.setdefault("baselines", []).append({**row, "min-max (s)": f"{min(runs):.3f}-{max(runs):.3f}"})

    def sweep(self) -> None:
        """One SWEEP_N-prompt /generate request per BATCH_SIZE, each on a fresh static-only service."""
        prompts, mt, rows = measure.make_prompts(SWEEP_N), self.args.max_tokens, self.res.setdefault("sweep", [])
        for bs in SWEEP:
            with Server(self.log_path, {"BATCH_SIZE": str(bs), "VLLM_ENABLED": "0", **SERVICE_ENV}) as srv:
                srv.wait_ready(READY_TIMEOUT_S)
                measure.grid_run(srv.url, "static", "one", prompts[: min(bs, 4)], mt)  # warm-up
                run = measure.grid_run(srv.url, "static", "one", prompts, mt)
            ms = sorted(d["queue_ms"] + d["inference_ms"] for d in run.details)  # per prompt
            row = {"BATCH_SIZE": bs, "N": SWEEP_N, "time (s)": round(run.seconds, 2)}
            row.update({"req/s": round(SWEEP_N / run.seconds, 1), "p50 latency (ms)": round(statistics.median(ms))})
            row["p99 latency (ms)"] = round(ms[math.ceil(0.99 * len(ms)) - 1])  # nearest rank
            rows.append({**row, "rounds (expected)": f"{run.rounds} ({math.ceil(SWEEP_N / bs)})"})

    def soak(self) -> None:
        """Overload, then recovery, at the service's own REQUEST_TIMEOUT_S (not SERVICE_ENV's): the
        client waits 30 s longer, so that a request the service holds is answered, not lost."""
        env = {"BATCH_SIZE": str(self.args.batch_size), "VLLM_ENABLED": str(int(not self.args.no_vllm))}
        with Server(self.log_path, env, url=self.args.url) as srv:
            srv.wait_ready(READY_TIMEOUT_S)
            timeout_s = Config.from_env().request_timeout_s + 30
            cpu = self.res["machine"]["cpu"]
            args = (cpu, self.args.soak_seconds, self.args.max_tokens, timeout_s)
            self.res.update(soak.run(srv.url, *args, probe_url=self.args.probe_url or srv.probe_url))

    @property
    def model_path(self) -> str:
        config = Config.from_env()
        return resolve_model(config.model, config.cache_dir)

    def profiled(self, only=None, **how) -> dict:
        """batcher/profile's measurement, unbounded, from the service's settings (as resolved)."""
        config, path = Config.from_env(), self.model_path
        base, how = (config.static_engine(path), config.vllm_engine(path)), {"cache": config.compile_cache_dir, **how}
        return profiling.measure(path, self.log_path, 7200, only, base, repeats=self.args.repeats, **how)

    def fidelity(self) -> None:  # every candidate against static fp32 eager, each in full and timed
        self.res["fidelity"] = [show.cells(row) for row in self.profiled(speed_always=True)["rows"]]

    def profile(self) -> None:
        """The stored profile beside a fresh measurement of every candidate it did not rule out
        (those its budget cut short too: `auto`'s choice must be near the fastest faithful one,
        not only near the fastest the budget reached)."""
        stored = store.load(store.machine_key(self.model_path), Config.from_env().profile_dir)
        if stored is None:
            raise RuntimeError("no stored profile for this machine: run `python -m batcher.profile --measure`")
        todo = {(r["engine"], r["dtype"], r["eager"]) for r in stored["rows"] if not choose.ruled_out(r)}
        self.res["profile"] = show.beside(stored, self.profiled(only=todo))

    def peers(self) -> None:  # the servers a user would run instead, one at a time (bench/peers.py)
        args = self.args
        out = peers.run(self.model_path, self.log_path, args.n, args.repeats, args.max_tokens, args.llama_server)
        self.res["notes"] += out.pop("failed")
        self.res.update(out)

    def startup(self) -> None:
        """Cold (a fresh COMPILE_CACHE_DIR) then warm (the same again), the service's settings from the
        environment: seconds to static ready, to a /generate sent 1 s later answered, to vLLM ready."""
        status = lambda health, engine: health.get("engines", {}).get(engine, {}).get("status")  # noqa: E731
        rows = self.res.setdefault("startup", [])
        with tempfile.TemporaryDirectory(prefix="compile-cache-") as cache:
            for kind in ("cold", "warm"):
                with Server(self.log_path, {"COMPILE_CACHE_DIR": cache}) as srv:
                    since = lambda: round(time.monotonic() - srv.started, 1)  # noqa: E731, B023
                    srv.wait_for(lambda h: status(h, "static") == "ready", STARTUP_TIMEOUT_S, "static engine ready")
                    row = {"start": kind, "static ready (s)": since()}
                    time.sleep(1.0)  # the probe: a /generate sent 1 s after the static engine is ready
                    run = measure.post(srv.url, "/generate", {"prompts": measure.make_prompts(4)})
                    round_s = max(d["inference_ms"] for d in run.details) / 1000
                    row["first /generate answered (s)"] = since()
                    row["its wait (s)"] = f"{run.seconds:.2f} (round {round_s:.2f})"
                    row["vLLM phase then"] = srv.engine("vllm").get("phase")
                    vllm = srv.wait_for(lambda h: status(h, "vllm") in SETTLED, STARTUP_TIMEOUT_S, "vLLM settled")
                    vllm, row["vLLM ready (s)"] = vllm["engines"]["vllm"], since()
                    row["vLLM"] = f"{vllm['status']}, {'eager' if vllm.get('eager') else 'compiled'}"
                    row["vLLM phases (s)"] = ", ".join(f"{k} {v:.1f}" for k, v in vllm["phase_seconds"].items())
                rows.append(row)
                print(f"  {row}", flush=True)


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
