"""The profile's key and its file: one JSON per key under PROFILE_DIR, written atomically.

The key holds what changes a measurement's answer: the CPU's model name and flags (what kernels
torch and vLLM can pick), torch's and vLLM's versions, our block kernels' source, and the model file (size and mtime: a
reconverted checkpoint is measured again). A changed machine finds no file for its key, and its
`auto`s fall back to fp32 eager until it is measured.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path

from batcher.settings import BLOCKS
from batcher.static import kernels

DEFAULT_PROFILE_DIR = ".cache/profile"  # PROFILE_DIR's default (service/config.py reads it here)


def cpu_info(path: str = "/proc/cpuinfo") -> dict:
    """The first processor's model name and sorted flags ({} where there is no /proc/cpuinfo)."""
    info: dict = {}
    try:
        text = Path(path).read_text()
    except OSError:
        return info
    for line in text.splitlines():
        name, _, value = (part.strip() for part in line.partition(":"))
        if name == "model name" and "model" not in info:
            info["model"] = value
        elif name == "flags" and "flags" not in info:
            info["flags"] = sorted(value.split())
    return info


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine_key(model_path: str, cpu: dict | None = None) -> dict:
    """What the profile's answers depend on."""
    weights = Path(model_path, "model.safetensors")
    stat = weights.stat() if weights.exists() else None
    return {
        "cpu": cpu if cpu is not None else cpu_info(),
        "torch": _version("torch"),
        "vllm": _version("vllm"),
        # beyond the dtypes: a profile from before a form was added measures again
        "forms": [f"static {BLOCKS}", f"static {BLOCKS} compiled", "static dense compiled, stored", f"vllm {BLOCKS}"],
        "kernels": kernels.digest(),  # a changed kernel changes the block rows' speeds
        "model": {
            "path": os.path.abspath(model_path),
            "bytes": stat and stat.st_size,
            "mtime_ns": stat and stat.st_mtime_ns,
        },
    }


def key_id(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def path_for(key: dict, folder: str | os.PathLike = DEFAULT_PROFILE_DIR) -> Path:
    return Path(folder, f"{key_id(key)}.json")


def load(key: dict, folder: str | os.PathLike = DEFAULT_PROFILE_DIR) -> dict | None:
    """The profile measured for `key`, or None (never measured, or a different machine)."""
    try:
        profile = json.loads(path_for(key, folder).read_text())
    except (OSError, ValueError):
        return None
    return profile if profile.get("key") == key else None


def save(profile: dict, folder: str | os.PathLike = DEFAULT_PROFILE_DIR) -> Path:
    """Write `profile` (which holds its key) atomically: a reader sees the old file or the new."""
    target = path_for(profile["key"], folder)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".profile-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(profile, out, indent=1)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise
    return target
