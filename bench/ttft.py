"""Time to first token on both stream endpoints, alone and behind a full round of 4.

python -m bench.ttft http://127.0.0.1:8000
"""

from __future__ import annotations

import statistics
import sys
import threading
import time

import requests

PROMPT = "The capital of France is"


def first_token_seconds(url: str, path: str) -> float:
    started = time.perf_counter()
    with requests.post(url + path, json={"prompt": PROMPT, "max_tokens": 20}, stream=True, timeout=300) as r:
        r.raise_for_status()
        next(line for line in r.iter_lines() if line.startswith(b"data: "))
        return time.perf_counter() - started


def behind_a_full_round(url: str, stream_path: str, batch_path: str) -> float:
    """A stream that arrives while four 20-token prompts are being generated."""
    body = {"prompts": [f"Tell me about topic {i}" for i in range(4)], "max_tokens": 20}
    engine = "static" if batch_path == "/generate" else "vllm"
    worker = threading.Thread(target=lambda: requests.post(url + batch_path, json=body, timeout=300).raise_for_status())
    worker.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until the four are running, not merely queued
        state = requests.get(url + "/health", timeout=10).json()["engines"][engine]
        if state["queued"] == 0 and state.get("inflight", state.get("running")) == 4:
            break
        time.sleep(0.01)  # a poll with a deadline; a tight loop would steal the CPUs being measured
    seconds = first_token_seconds(url, stream_path)
    worker.join()
    return seconds


def main(url: str, repeats: int = 5) -> None:
    for name, stream_path, batch_path in (
        ("static", "/generate_stream", "/generate"),
        ("vLLM", "/generate_vllm_stream", "/generate_vllm"),
    ):
        first_token_seconds(url, stream_path)  # warm-up
        alone = statistics.median(first_token_seconds(url, stream_path) for _ in range(repeats))
        behind = statistics.median(behind_a_full_round(url, stream_path, batch_path) for _ in range(repeats))
        print(
            f"{name:>6}: time to first token alone {alone * 1000:7.1f} ms, "
            f"behind a running round of 4: {behind * 1000:7.1f} ms"
        )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000")
