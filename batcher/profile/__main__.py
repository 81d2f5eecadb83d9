"""`python -m batcher.profile`: this machine's profile as a table, and what each engine's `auto`
resolves to. `--measure` measures again (`--budget` seconds in all); `--if-missing` measures only
when there is no profile for this machine's key (what `make setup` runs); `--finish-in-background`
then starts the run that measures the compiled rows the budget cut short (finish.py), which
`--finish` is; `--wait` waits for that run. Reads MODEL, CACHE_DIR, PROFILE_DIR and
COMPILE_CACHE_DIR from the environment, as the service does."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from batcher.checkpoint import DEFAULT_CACHE_DIR, DEFAULT_MODEL, resolve_model
from batcher.compile_cache import DEFAULT_COMPILE_CACHE_DIR
from batcher.profile import choose, finish, measure, show, store


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m batcher.profile", description=__doc__.split("\n")[0])
    p.add_argument("--measure", action="store_true", help="measure this machine again")
    p.add_argument("--if-missing", action="store_true", help="measure only if this machine has no profile")
    p.add_argument("--budget", type=float, default=measure.BUDGET_S, help="seconds for the whole measurement")
    p.add_argument("--finish-in-background", action="store_true", help="then finish the compiled rows on its own")
    p.add_argument("--finish", action="store_true", help="measure the compiled rows the budget cut short")
    p.add_argument("--wait", action="store_true", help="wait for a background finish of this profile")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    model_path = resolve_model(os.environ.get("MODEL", DEFAULT_MODEL), os.environ.get("CACHE_DIR", DEFAULT_CACHE_DIR))
    folder = os.environ.get("PROFILE_DIR", store.DEFAULT_PROFILE_DIR)
    cache = os.environ.get("COMPILE_CACHE_DIR", DEFAULT_COMPILE_CACHE_DIR)
    key = store.machine_key(model_path)
    if args.wait:
        if not finish.wait(key, folder, finish.FINISH_BUDGET_S + 120):
            print("the profile's background run is still going: going on without it", flush=True)
        return 0
    if args.finish:
        profile = finish.run(model_path, folder, cache, finish.log_path(key, folder))
        print("\n".join(show.lines(profile)) if profile else "nothing to finish")
        return 0
    finish.wait(key, folder, finish.FINISH_BUDGET_S + 120)  # never two measurements side by side
    profile = store.load(key, folder)
    if args.measure or (args.if_missing and profile is None):
        log_path = Path(tempfile.gettempdir()) / f"profile-{time.strftime('%Y%m%dT%H%M%S')}.log"
        print(f"measuring this machine, {args.budget:.0f} s at most (engines' output: {log_path})", flush=True)
        profile = measure.measure(model_path, log_path, args.budget, cache=cache)
        print(f"wrote {store.save(profile, folder)}")
    print("\n".join(show.lines(profile)))
    todo = finish.unfinished(profile)
    if args.finish_in_background and todo:
        proc = finish.start(folder, finish.log_path(key, folder))
        rows = ", ".join(f"{engine} {choose.SHORT[dtype]} compiled" for engine, dtype, _ in todo)
        print(f"the budget cut short {rows}: measuring on in the background (pid {proc.pid}, log:")
        print(f"  {finish.log_path(key, folder)}); make serve, test and bench wait for it, and take its result")
    return 0


if __name__ == "__main__":
    sys.exit(main())
