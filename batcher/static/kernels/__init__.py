"""C++ kernels of the static engine, built at run time by batcher/static/blocks.py."""

import hashlib
from pathlib import Path

SOURCE = Path(__file__).parent / "blocks.cpp"


def digest() -> str:
    """The source's hash: the folder its build goes to, and part of the profile's key (the block
    rows' speeds are this source's)."""
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
