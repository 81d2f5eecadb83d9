"""`make serve`, `make cluster` and `make rolling-restart`: the service behind nginx, run by supervisord.

Nothing here balances or supervises. `serve` is a cluster of one replica bound to loopback (nginx
buffers each request before gunicorn sees it, so slow clients hold no gunicorn thread); without
nginx it warns and runs plain gunicorn on HOST:PORT. `run` renders deploy/*.j2 into a run folder and becomes
supervisord (foreground), which runs nginx and the replicas; Ctrl-C or SIGTERM makes it stop them,
each replica draining. `rolling-restart` restarts one replica at a time with supervisorctl, taking
it out of nginx's upstream (`down`, reload) while it drains and loads, and puts it back and goes on
to the next only once it answers /health 200 again.

Settings come from the environment, as for `make serve`: PORT (nginx; replicas on PORT+1..PORT+
REPLICAS, and their probe servers, deploy/probe.py, on the REPLICAS ports after those), REPLICAS,
HOST (nginx; loopback unless set), REPLICA_HOST (the replicas; loopback unless set), CLUSTER_DIR
(the run folder), and every service knob, which the replicas inherit. ACCEL=gpu gives replica i the
GPU i-1 (CUDA_VISIBLE_DEVICES). Listening beyond loopback with no API_KEY logs a warning (so does
each replica's gunicorn, gunicorn.conf.py). Two settings have no variable, for a caller that places
the programs on other hosts (deploy/hosts.py): a host per replica, and a prefix per program's
command (e.g. `ip netns exec h1`).

    python -m deploy.cluster serve | run | rolling-restart
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import subprocess
import sys

# what `run`, `serve` and `rolling-restart` are made of, each in a module of its own
from deploy.first_profile import missing
from deploy.listen import DEFAULT_HOST, warn_if_open  # gunicorn.conf.py imports both from here
from deploy.render import render
from deploy.rolling_restart import rolling_restart
from deploy.settings import ROOT, Settings
from deploy.tools import find_tool, require_tool


def supervisord_command(s: Settings) -> list[str]:
    """All `run` does before it becomes supervisord (the warning, the configs, the settings that
    `rolling-restart` renders from); returns supervisord's command line, for a caller that runs
    the cluster as its child (tests/e2e/test_hosts.py)."""
    warn_if_open(logging.getLogger("deploy.cluster"), "nginx", s.host, s.port, s.has_api_key)
    conf = render(s)
    s.save()
    replicas = ", ".join(f"{s.replica_at(i)[1]}:{port}" for i, port in enumerate(s.replica_ports, 1))
    print(f"cluster: nginx on {s.host}:{s.port}, gunicorn on {replicas}; logs in {s.run_dir}", flush=True)
    return [require_tool("supervisord"), "-n", "-c", str(conf)]


def run(s: Settings) -> None:
    command = supervisord_command(s)
    os.execv(command[0], command)  # signals go straight to it


def serve(s: Settings) -> None:
    """`make serve`: nginx on HOST:PORT in front of one gunicorn on 127.0.0.1:PORT+1; without
    nginx, plain gunicorn on HOST:PORT, which slow clients can starve (docs/operations.md)."""
    if find_tool("nginx") is None:  # e.g. `make setup` not run as root
        logging.getLogger("deploy.serve").warning(
            "nginx not found (`make setup` installs it when run as root): serving with plain gunicorn on"
            " %s:%d, whose THREADS connections that send half a request can hold",
            s.host,
            s.port,
        )
        gunicorn, env = require_tool("gunicorn"), {**os.environ, "HOST": s.host, "PORT": str(s.port)}
        if s.preload:
            env["LD_PRELOAD"] = s.preload
        os.chdir(ROOT)
        if missing(s.accel):  # no second replica to switch to: measure first, as `make setup` does
            budget = os.environ.get("PROFILE_BUDGET", "200")
            subprocess.run([sys.executable, "-m", "batcher.profile", "--if-missing", "--budget", budget], env=env)
        os.execve(gunicorn, [gunicorn, "-c", "gunicorn.conf.py", "wsgi:app"], env)
    else:
        # no profile yet: serve now with the defaults, measure beside, then switch (deploy/first_profile.py)
        first = missing(s.accel)
        if first:
            print("serve: no profile for this machine yet: serving with the defaults now, measuring it once"
                  " the engines are ready, then switching to its choices, no request dropped", flush=True)  # fmt: skip
        one = dataclasses.replace(s, replicas=2 if first else 1, replica_host=DEFAULT_HOST, first_profile=first)
        run(dataclasses.replace(one, logs_to_terminal=True))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["serve", "run", "render", "rolling-restart"])
    parser.add_argument("--health-timeout", type=float, default=600, help="seconds a replica may take to be healthy")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    from service.config import SettingError

    try:
        settings = Settings.from_env()
    except SettingError as exc:  # one line naming the setting, no traceback
        raise SystemExit(f"deploy.cluster: not starting: {exc}") from None
    if args.command == "serve":
        serve(settings)
    elif args.command == "run":
        run(settings)
    elif args.command == "render":
        print(render(settings))
    else:
        rolling_restart(settings.run_dir, args.health_timeout)


if __name__ == "__main__":
    main()
