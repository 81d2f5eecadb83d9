"""The compiled rows that `make setup`'s budget cut short, measured to their end in the background.

A cold compile outlasts the profile's budget on some CPUs
(docs/performance.md#the-machine-profile-faithful-first-then-fastest), and then `auto` never sees
a compiled row. So, after the budgeted run, `start` launches `python -m batcher.profile --finish` on its
own: per engine, the compiled form of its fastest faithful eager row (`unfinished`), each with
FINISH_CAP_S, against a reference measured again in the same run. It holds a lock while it runs
(`lock_path`); `make serve`, `make test` and `make bench` wait for it first (`wait`), so that
nothing is timed beside it and the server starts on the finished profile. It runs once per
profile: its result, or why it failed, is written into the profile (`finished_at`), and a
profile measured again (`make profile PROFILE_ARGS=--measure`) starts over.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from batcher.profile import choose, measure, store

# one compiled candidate, its cold compile included: the static blocks' graphs with cpp_wrapper are
# the longest seen (docs/operations.md, docs/performance.md#the-blocks-compiled-once-loaded-at-every-start)
FINISH_CAP_S = 900.0
FINISH_BUDGET_S = FINISH_CAP_S / measure.CAP_SHARE  # so that each candidate's cap is FINISH_CAP_S


def unfinished(profile: dict | None) -> list[tuple[str, str, bool]]:
    """Per engine (vLLM first), the compiled form of its fastest faithful eager row that `auto`
    may take (choose.best_to_compile), where the budget or its cap cut it short, or where a cold
    compile spent its cap ("too slow" after compiling: a later start loads the graphs); [] once
    finished, or with nothing faithful to compile."""
    if profile is None or profile.get("finished_at") or profile.get("reference") != "measured":
        return []
    rows, todo = profile["rows"], []
    for engine in ("vllm", "static"):
        best = choose.best_to_compile(rows, engine)
        if best is None:
            continue
        candidate = (engine, best["dtype"], False)
        row = next((r for r in rows if (r["engine"], r["dtype"], r["eager"]) == candidate), None)
        status = "" if row is None else row.get("status", "")
        if row is None or status.startswith("timed out") or (status.startswith("too slow") and row.get("compile_s")):
            todo.append(candidate)
    return todo


def merge(profile: dict, finished: dict, todo: list[tuple[str, str, bool]], wall_s: float) -> dict:
    """`profile` with the rows of `todo` as `finished` (the background run) measured them."""
    new = {(r["engine"], r["dtype"], r["eager"]): r for r in finished["rows"]}
    rows = [new.get((r["engine"], r["dtype"], r["eager"]), r) if _key(r) in todo else r for r in profile["rows"]]
    rows += [new[c] for c in todo if c in new and c not in {_key(r) for r in profile["rows"]}]
    when = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {**profile, "rows": rows, "finished_at": when, "finish_wall_s": round(wall_s)}


def _key(row: dict) -> tuple[str, str, bool]:
    return row["engine"], row["dtype"], row["eager"]


def lock_path(key: dict, folder: str | os.PathLike) -> Path:
    return Path(folder, f"{store.key_id(key)}.finishing")


def start(folder: str | os.PathLike, log_path: Path) -> subprocess.Popen:
    """`python -m batcher.profile --finish` on its own (its own session: it outlives `make setup`),
    with this process's environment (MODEL, CACHE_DIR, PROFILE_DIR, COMPILE_CACHE_DIR)."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PROFILE_DIR": str(folder)}
    with open(log_path, "a") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "batcher.profile", "--finish"], cwd=root, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
        )  # fmt: skip


class Lock:
    """The finishing run's lock, held for its life: an flock, so a killed run leaves none behind."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def take(self) -> bool:
        """Exclusively, at once: False where another run holds it."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def free(self) -> bool:
        """Whether no run holds it (checked by taking it shared, and letting go)."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        return True

    def close(self) -> None:
        os.close(self.fd)


def wait(key: dict, folder: str | os.PathLike, timeout_s: float) -> bool:
    """Until no finishing run holds this profile's lock, or `timeout_s`: whether it is free."""
    path = lock_path(key, folder)
    if not path.exists():
        return True
    lock = Lock(path)
    free = lock.free()
    if free or timeout_s <= 0:
        lock.close()
        return free
    print(f"waiting for this machine's profile to finish its compiled rows (log: {log_path(key, folder)})", flush=True)
    freed = threading.Event()

    def take_shared() -> None:  # blocks until the run ends (or dies: the kernel drops its flock)
        fcntl.flock(lock.fd, fcntl.LOCK_SH)
        lock.close()  # which lets go of it
        freed.set()

    threading.Thread(target=take_shared, daemon=True).start()
    return freed.wait(timeout_s)


def log_path(key: dict, folder: str | os.PathLike) -> Path:
    return Path(folder, f"{store.key_id(key)}.finish.log")


def run(model_path: str, folder: str | os.PathLike, cache: str, log_path: Path) -> dict | None:
    """The background run: the unfinished rows measured and merged into the profile, which is
    marked finished whatever happens (so no run starts again for it). None: nothing to do, or
    another run holds the lock."""
    key = store.machine_key(model_path)
    lock = Lock(lock_path(key, folder))
    try:
        if not lock.take():
            return None
        profile = store.load(key, folder)
        todo = unfinished(profile)
        if not todo:
            return None
        started = time.monotonic()
        try:
            finished = measure.measure(model_path, log_path, FINISH_BUDGET_S, only=todo, cache=cache)
        except Exception as exc:  # recorded, so that no run starts again for this profile
            profile = {**profile, "finished_at": f"failed: {type(exc).__name__}: {exc}"}
        else:
            profile = merge(store.load(key, folder) or profile, finished, todo, time.monotonic() - started)
        store.save(profile, folder)
        return profile
    finally:
        lock.close()
