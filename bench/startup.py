"""Start-up, cold (a fresh COMPILE_CACHE_DIR) then warm (the same again, as a second `make serve`):
time to static ready, to the first /generate answer (sent 1 s after static ready, while vLLM is
still starting), to vLLM ready, and vLLM's phases. `python -m bench.startup [--env NAME=VALUE]`."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.measure import timed_post
from bench.server import SETTLED, Server

PROMPTS = ["The capital of France is", "Water boils at", "Once upon a time", "def fibonacci(n):"]
TIMEOUT_S = 1500
HEADER = "| settings | start | static ready (s) | first /generate answered (s) | its wait (s) | vLLM phase then"
HEADER += " | vLLM ready (s) | vLLM phases (s) |"


def one_start(env: dict[str, str], log_path: Path) -> dict:
    """One service start; times are seconds since gunicorn was launched."""
    srv = Server(log_path, env)
    status = lambda health, engine: health.get("engines", {}).get(engine, {}).get("status")  # noqa: E731
    try:
        srv.wait_for(lambda h: status(h, "static") == "ready", TIMEOUT_S, "static engine ready")
        row = {"static_ready_s": time.monotonic() - srv.started}
        time.sleep(1.0)  # the probe: a /generate sent 1 s after the static engine is ready
        wait, resp = timed_post(srv.url, "/generate", {"prompts": PROMPTS, "details": True})
        row.update(first_generate_s=time.monotonic() - srv.started, first_generate_wait_s=wait)
        row["first_round_s"] = max(d["inference_ms"] for d in resp.json()["details"]) / 1000
        row["vllm_phase_at_answer"] = srv.engine("vllm").get("phase")
        vllm = srv.wait_for(lambda h: status(h, "vllm") in SETTLED, TIMEOUT_S, "vLLM settled")["engines"]["vllm"]
        row.update(
            vllm_ready_s=time.monotonic() - srv.started, vllm_status=vllm["status"], vllm_eager=vllm.get("eager")
        )
        row["vllm_phase_seconds"] = vllm.get("phase_seconds")
        if vllm["status"] == "ready":
            wait, resp = timed_post(srv.url, "/generate_vllm", {"prompts": PROMPTS})
            row.update(first_vllm_answer_s=wait, vllm_text=resp.json()["generated_texts"][0])
    finally:
        srv.stop()
    return row


def cold_and_warm(env: dict[str, str], log_path: Path) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="compile-cache-") as cache:
        for kind in ("cold", "warm"):
            rows.append({"start": kind, "env": env, **one_start({**env, "COMPILE_CACHE_DIR": cache}, log_path)})
            print(f"  {kind}: {rows[-1]}", flush=True)
    return rows


def table(rows: list[dict]) -> list[str]:
    lines = [HEADER, "|---" * 8 + "|"]
    for r in rows:
        settings = " ".join(f"{k}={v}" for k, v in r["env"].items()) or "defaults"
        phases = ", ".join(f"{k} {v:.1f}" for k, v in (r.get("vllm_phase_seconds") or {}).items())
        lines.append(
            f"| {settings} | {r['start']} | {r['static_ready_s']:.1f} | {r['first_generate_s']:.1f} |"
            f" {r['first_generate_wait_s']:.2f} (round {r['first_round_s']:.2f}) | {r['vllm_phase_at_answer']} |"
            f" {r['vllm_ready_s']:.1f} | {phases} |"
        )
    return lines


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__.split("\n\n")[0])
    p.add_argument("--env", action="append", default=[], help="NAME=VALUE for the service; repeatable")
    env = dict(item.split("=", 1) for item in p.parse_args().env)
    print("\n".join(table(cold_and_warm(env, Path(tempfile.gettempdir()) / "bench-startup.log"))))
