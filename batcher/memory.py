"""This process's resident memory: what the profile records of each candidate (its engine's
share) and of the worker's imports, what MEMORY_BUDGET_GIB is checked against, what /health shows."""

from __future__ import annotations

import ctypes
import gc
from pathlib import Path


def resident_mib(field: str = "VmRSS") -> int:
    """This process's `field` of /proc/self/status (VmRSS: now; VmHWM: its peak), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return round(int(line.split()[1]) / 1024)
    raise LookupError(field)


def release_free_memory() -> None:
    """Collect, then hand the allocator's free pages back to the system, so that the next reading
    counts live memory only (a dropped engine's pages would otherwise be counted, then reused by
    the next). tcmalloc (make serve's PRELOAD) and glibc each have their own call; with tcmalloc
    preloaded, glibc's trims an arena nothing uses."""
    gc.collect()
    libc = ctypes.CDLL(None)
    for name, args in (("MallocExtension_ReleaseFreeMemory", ()), ("malloc_trim", (0,))):
        release = getattr(libc, name, None)
        if release is not None:
            release(*args)
