"""Start-up, cold and warm: time to static ready, to the first /generate answer (sent 1 s after
static ready, while vLLM is still starting), to vLLM ready, and vLLM's phases.

    python -m bench.startup                          # the shipped defaults, cold then warm
    python -m bench.startup --env VLLM_ENFORCE_EAGER=0   # compiled vLLM

Cold: a fresh, empty COMPILE_CACHE_DIR. Warm: the same folder again, as a second `make serve`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import requests

from bench.server import SETTLED, Server

PROMPTS = ["The capital of France is", "Water boils at", "Once upon a time", "def fibonacci(n):"]


def _health(url: str) -> dict:
    try:
        return requests.get(url + "/health", timeout=5).json()
    except (requests.RequestException, ValueError):
        return {}


def one_start(env: dict[str, str], log_path: Path, timeout_s: float = 1500) -> dict:
    """One service start; times are seconds since gunicorn was launched."""
    t0 = time.monotonic()
    srv = Server(log_path, env)
    row: dict = {}
    try:
        deadline = t0 + timeout_s
        while time.monotonic() < deadline:  # poll: the service announces readiness only on /health
            if srv.proc.poll() is not None:
                raise RuntimeError(f"service exited with code {srv.proc.returncode}; see {log_path}")
            static = _health(srv.url).get("engines", {}).get("static", {})
            if static.get("status") == "ready":
                row["static_ready_s"] = time.monotonic() - t0
                break
            time.sleep(0.2)
        else:
            raise TimeoutError(f"static engine not ready after {timeout_s}s")
        time.sleep(1.0)  # the probe: a /generate sent 1 s after the static engine is ready
        sent = time.monotonic()
        r = requests.post(srv.url + "/generate", json={"prompts": PROMPTS, "details": True}, timeout=timeout_s)
        r.raise_for_status()
        row["first_generate_s"] = time.monotonic() - t0
        row["first_generate_wait_s"] = time.monotonic() - sent
        row["first_round_s"] = max(d["inference_ms"] for d in r.json()["details"]) / 1000
        row["vllm_phase_at_answer"] = _health(srv.url).get("engines", {}).get("vllm", {}).get("phase")
        while time.monotonic() < deadline:
            vllm = _health(srv.url).get("engines", {}).get("vllm", {})
            if vllm.get("status") in SETTLED:
                break
            time.sleep(0.2)
        row["vllm_ready_s"] = time.monotonic() - t0
        row["vllm_status"] = vllm.get("status")
        row["vllm_phase_seconds"] = vllm.get("phase_seconds")
        row["vllm_eager"] = vllm.get("eager")
        sent = time.monotonic()
        r = requests.post(srv.url + "/generate_vllm", json={"prompts": PROMPTS}, timeout=timeout_s)
        row["first_vllm_answer_s"] = time.monotonic() - sent if r.ok else None
        row["vllm_text"] = r.json()["generated_texts"][0] if r.ok else r.text
    finally:
        srv.stop()
    return row


def cold_and_warm(env: dict[str, str], log_path: Path) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="compile-cache-") as cache:
        for kind in ("cold", "warm"):
            row = one_start({**env, "COMPILE_CACHE_DIR": cache}, log_path)
            rows.append({"start": kind, "env": env, **row})
            print(f"  {kind}: {row}", flush=True)
    return rows


def table(rows: list[dict]) -> list[str]:
    lines = [
        "| settings | start | static ready (s) | first /generate answered (s) | its wait (s) | vLLM phase then"
        " | vLLM ready (s) | vLLM phases (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        settings = " ".join(f"{k}={v}" for k, v in r["env"].items()) or "defaults"
        phases = ", ".join(f"{k} {v:.1f}" for k, v in (r.get("vllm_phase_seconds") or {}).items())
        lines.append(
            f"| {settings} | {r['start']} | {r['static_ready_s']:.1f} | {r['first_generate_s']:.1f} |"
            f" {r['first_generate_wait_s']:.2f} (round {r['first_round_s']:.2f}) | {r['vllm_phase_at_answer']} |"
            f" {r['vllm_ready_s']:.1f} | {phases} |"
        )
    return lines


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__.split("\n\n")[0])
    p.add_argument("--env", action="append", default=[], help="NAME=VALUE for the service; repeatable")
    p.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "bench-startup.log")
    args = p.parse_args(argv)
    env = dict(item.split("=", 1) for item in args.env)
    rows = cold_and_warm(env, args.log)
    print("\n".join(table(rows)))
    return rows


if __name__ == "__main__":
    main()
