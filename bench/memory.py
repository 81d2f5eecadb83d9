"""The memory phase: where the worker's resident memory goes. For each form (the service's own
settings, then the weights forced to each dtype), a process of its own builds what the worker
builds, one piece at a time (torch, the libraries, the app, vLLM's modules, the static engine, the
vLLM engine with its KV cache), then serves a few requests through the app: its VmRSS after each
piece (the increase, MiB), at rest with both engines ready, and its VmHWM at the end. Run it under
the service's preloads (`make bench` passes tcmalloc, as `make serve` does): the allocator decides
what freed memory stays resident."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# env on top of ours, per row: the defaults, the KV cache's former default, the weights in fp32, the blocks
FORMS = {
    "the service's settings": {},
    "VLLM_KV_CACHE_GIB=1": {"VLLM_KV_CACHE_GIB": "1"},
    "DTYPE=float32": {"DTYPE": "float32"},
    "STATIC_WEIGHTS=blocks": {"STATIC_WEIGHTS": "blocks"},  # the GGUF's blocks instead of dense fp32 linears
}
CHAT = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 20,
        "temperature": 0}  # fmt: skip
WIDE = {"messages": [{"role": "user", "content": "Tell me a story. " * 60}], "max_tokens": 64, "temperature": 0,
        "n": 4}  # a 300-token prompt, 4 choices: a wider step and more KV cache  # fmt: skip
TIMEOUT_S = 1200  # one form's process: a cold compile of vLLM's graph included


def run(log_path: Path) -> list[dict]:
    """One row per form, each measured in a process of its own."""
    rows = []
    for form, env in FORMS.items():
        with tempfile.TemporaryDirectory(prefix="bench-memory-") as data, open(log_path, "ab") as log:
            done = subprocess.run([sys.executable, "-m", "bench.memory"], env={**os.environ, **env, "DATA_DIR": data},
                                  stdout=subprocess.PIPE, stderr=log, timeout=TIMEOUT_S, check=True)  # fmt: skip
        rows.append({"form": form, **json.loads(done.stdout.decode().splitlines()[-1])})
        print(f"  {rows[-1]}", flush=True)
    return rows


class Resident:
    """This process's VmRSS now (MiB), and how much it grew since the last reading."""

    def __init__(self):
        self.last, self.row = 0, {}

    def read(self, field: str = "VmRSS") -> int:
        status = Path("/proc/self/status").read_text().splitlines()
        return round(int(next(line.split()[1] for line in status if line.startswith(field + ":"))) / 1024)

    def grew(self, what: str) -> None:
        now = self.read()
        self.row[what + " (+MiB)"], self.last = now - self.last, now


def main() -> dict:
    """The child: each piece, then the requests; its row."""
    seen = Resident()
    seen.grew("python")
    from batcher.compile_cache import import_torch_first

    import_torch_first()
    seen.grew("torch")
    import service  # flask, transformers (its models and tokenizers load in create_app), pydantic, SQLAlchemy
    from service.http.state import app_state

    app = service.create_app(start=False)
    state = app_state(app)
    seen.grew("the app: flask, transformers, the service")
    import vllm  # noqa: F401

    seen.grew("vLLM's modules")
    static, engine = state.engines["static"], state.engines["vllm"]
    static.start().wait_ready()
    seen.grew("static engine")
    engine.start().wait_ready()
    seen.grew("vLLM engine")
    seen.row["static"], seen.row["vLLM"] = _form(static.settings.shown()), _form(engine.settings.shown())
    seen.row["vLLM KV cache (GiB)"] = engine.settings.kv_cache_gib if engine.settings.device == "cpu" else None
    state.runner.start()
    state.load_tokenizer()
    seen.row["at rest, both engines ready (MiB)"] = seen.read()
    client = app.test_client()
    for body in (CHAT, WIDE, {**CHAT, "response_format": {"type": "json_object"}}):
        for base in ("/static/v1", "/v1"):
            reply = client.post(f"{base}/chat/completions", json=body)
            if reply.status_code != 200:
                raise RuntimeError(f"{base}: {reply.status_code} {reply.get_data(as_text=True)[:200]}")
    seen.row["after the requests (MiB)"] = seen.read()
    seen.row["peak (VmHWM, MiB)"] = seen.read("VmHWM")
    service.shutdown(app, 30)
    return seen.row


def _form(shown: dict) -> str:
    eager = shown.get("enforce_eager", not shown.get("compile"))
    return f"{shown['dtype']} {'eager' if eager else 'compiled'}"


if __name__ == "__main__":
    real, sys.stdout = sys.stdout, sys.stderr  # the libraries' prints go to the log, not into the row
    row = main()
    real.write(json.dumps(row) + "\n")
