"""One benchmark run: its phases in order (those on the service, then those in processes of their
own), each timed; what each measures goes into one results dict, written as JSON."""

import argparse
import contextlib
import dataclasses
import math
import os
import statistics
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from batcher.checkpoint import resolve_model
from batcher.profile import child, choose, show, store
from batcher.profile import measure as profiling
from bench import batch, conversation, measure, memory, peers, report, serve_client, soak, structured, wait
from deploy.server import SETTLED, Server
from service.config import Config

SWEEP_N, SWEEP, BASIC_MAX_N, READY_TIMEOUT_S, STARTUP_TIMEOUT_S = 64, [1, 2, 4, 8, 16, 64], 16, 300, 1500
ON_THE_SERVICE = ("grid", "ttft", "structured", "openai", "wait")
# the service stopped; each in processes of its own
LATER = ("direct", "offline", "sweep", "fidelity", "profile", "startup", "memory", "peers")
ASKED = ("soak", "batch")  # only in --only: minutes (soak) to an hour (batch), on a service of their own (or --url)
QUICK = {"n": [1, 4, 16], "repeats": 1, "phases": ("grid", "ttft", "structured", "direct", "offline")}
FULL = {"n": [1, 4, 16, 64], "repeats": 3, "phases": ON_THE_SERVICE + LATER}
# the service waits as long as our requests do, so a slow shared machine makes slow numbers, not 504s
SERVICE_ENV = {"REQUEST_TIMEOUT_S": str(measure.TIMEOUT_S)}


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
        self.res["conversation_ttft"] = [conversation.ratio(self.srv.url, engine) for engine in self.engines]

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

    def batch(self) -> None:
        """Our Batch API on each engine of a service of its own, then, that service stopped, vLLM's
        run_batch on the same file alone (not with --url: that service is not ours to stop)."""
        args, lines, machine = self.args, batch.make_lines(self.args.batch_lines), self.res["machine"]
        machine = f"{machine['cpu']}, {machine['cores']} cores"
        env = {"BATCH_SIZE": str(args.batch_size), "VLLM_ENABLED": str(int(not args.no_vllm)), **SERVICE_ENV}
        with tempfile.TemporaryDirectory(prefix="bench-jobs-") as data:  # the batches' database, gone after
            with Server(self.log_path, {**env, "DATA_DIR": data}, url=args.url) as srv:
                engines = batch.ready_engines(srv.wait_ready(READY_TIMEOUT_S))
                out = batch.on_service(srv.url, engines, lines, args.max_tokens, machine)
        if args.url or "vllm" not in engines:
            out["failed"].append(f"batch: run_batch skipped ({'--url' if args.url else 'the vLLM engine not ready'})")
        else:
            batch.beside_run_batch(out, self.model_path, lines, self.log_path, machine)
        self.res["batch_targets"] = batch.ratios(out)
        self.res["notes"] += out.pop("failed")
        self.res.update(out)

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

    def memory(self) -> None:  # where the worker's resident memory goes, a process per form
        self.res["memory"] = memory.run(self.log_path)

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
                    time.sleep(1.0)  # the startup probe: a /generate sent 1 s after the static engine is ready
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
