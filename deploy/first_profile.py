"""`make serve` on a machine with no profile yet: the first answer comes before the profile.

Measuring the machine (batcher/profile: about 200 s, and more for the compiled rows its budget cuts
short) was most of the time from `git clone` to a first answer. So `deploy/cluster.py serve`, where
this machine has no profile, runs two replicas' programs under supervisord: replica1 starts at
once, with what every `auto` means without a profile (fp32 eager: faithful, nothing compiled);
replica2 does not start and is out of nginx's upstream. This program (supervisord's
`first-profile`) waits until replica1 has every engine settled, measures the profile as `make
setup` would (its budget, then the rows the budget cut short, unless PROFILE_FINISH=0), starts
replica2 (its `auto`s now read the profile), and once replica2's engines are ready moves nginx to
it (replica1 `down`, a graceful reload: nginx finishes what it sent there) and stops replica1,
which drains. No request is dropped: each is answered by one replica or the other. A profile that
fails, or a replica2 that never gets ready, leaves replica1 serving; the log says why.

    python -m deploy.first_profile RUN_DIR
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from deploy.render import render
from deploy.settings import ROOT, Settings
from deploy.tools import require_tool

SETTLED_TIMEOUT_S = 900  # a replica's engines loading, a cold compile included
SETTLED = {"ready", "disabled"}


def missing(accel: str) -> bool:
    """Whether this machine has no profile yet: a CPU's `auto`s read one (a GPU's never do)."""
    if accel != "cpu":
        return False
    from batcher.checkpoint import DEFAULT_CACHE_DIR, DEFAULT_MODEL, resolve_model
    from batcher.profile import store

    model_path = resolve_model(os.environ.get("MODEL", DEFAULT_MODEL), os.environ.get("CACHE_DIR", DEFAULT_CACHE_DIR))
    folder = os.environ.get("PROFILE_DIR", store.DEFAULT_PROFILE_DIR)
    return store.load(store.machine_key(model_path), folder) is None


def engines(address: str, port: int) -> dict[str, str]:
    """Each engine's status as the replica's /health says it ({} while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://{address}:{port}/health", timeout=5) as reply:
            body = json.load(reply)
    except urllib.error.HTTPError as refused:  # 503 while loading, draining or failed: its body says which
        body = json.load(refused)
    except (urllib.error.URLError, OSError, ValueError):
        return {}
    return {name: engine.get("status", "") for name, engine in body.get("engines", {}).items()}


def wait_settled(address: str, port: int, timeout_s: float = SETTLED_TIMEOUT_S) -> None:
    """Until every engine of the replica is ready (or disabled); raises if one failed or time ran out."""
    deadline = time.monotonic() + timeout_s
    while not (status := engines(address, port)) or not set(status.values()) <= SETTLED:
        if "failed" in status.values():
            raise RuntimeError(f"the replica on :{port} has a failed engine: {status}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the replica on :{port} not settled after {timeout_s:.0f} s: {status}")
        time.sleep(1)


def switch(s: Settings) -> None:
    supervisorctl = require_tool("supervisorctl")

    def ctl(*args: str) -> None:
        subprocess.run([supervisorctl, "-c", str(s.supervisord_conf), *args], check=True, stdout=subprocess.DEVNULL,
                       timeout=s.graceful_timeout_s + 60)  # fmt: skip

    (_, first), (_, second) = s.replica_at(1), s.replica_at(2)
    wait_settled(first, s.replica_ports[0])
    say("replica1 serves with the defaults; measuring this machine's profile beside it")
    # the block kernels first (`make setup`'s step; a minute once): built inside a candidate, they
    # would spend its cap
    steps = [
        ["batcher.static.blocks"],
        ["batcher.profile", "--if-missing", "--budget", os.environ.get("PROFILE_BUDGET", "200")],
    ]
    if os.environ.get("PROFILE_FINISH", "background") != "0":
        steps.append(["batcher.profile", "--finish"])  # the rows the budget cut short, as `make setup`'s background run
    for args in steps:
        subprocess.run([sys.executable, "-m", *args], cwd=ROOT, check=True)
    say("profile stored; starting replica2 with its choices")
    ctl("start", "replicas:replica2")
    wait_settled(second, s.replica_ports[1])
    render(s, down=1)
    ctl("signal", "HUP", "nginx")  # graceful: what nginx sent to replica1 finishes there
    say("nginx sends everything to replica2 now; replica1 drains and stops")
    ctl("stop", "replicas:replica1")
    say("switched to the profile's choices")


def say(message: str) -> None:
    print(f"first-profile: {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    run_dir = Path((argv if argv is not None else sys.argv[1:])[0])
    try:
        switch(Settings.load(run_dir))
    except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
        say(f"no switch, replica1 keeps serving with the defaults: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
