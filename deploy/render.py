"""nginx.conf and supervisord.conf, rendered from deploy/*.j2 into the cluster's run folder."""

from __future__ import annotations

import sys
from pathlib import Path

import jinja2

from deploy.settings import ROOT, Settings
from deploy.starts import EXIT_STATUS
from deploy.tools import require_tool

HERE = Path(__file__).resolve().parent
MAX_FAILS = 3
FAIL_TIMEOUT_S = 5
# nginx resends a refused request at most once more (proxy_next_upstream_tries counts the first
# try), and only within this many seconds of its first: a replica refuses in milliseconds, so a
# later failure is not a refusal, and a second refusal says the cluster is full (the client has
# Retry-After). deploy/nginx.conf.j2 says which failures are resent.
NEXT_UPSTREAM_TRIES = 2
NEXT_UPSTREAM_TIMEOUT_S = 10


def _supervisor_value(value: str) -> str:
    """A value for supervisord's `environment=`: quoted, and % doubled (its own expansion)."""
    return '"' + value.replace("%", "%%").replace('"', '\\"') + '"'


def render(s: Settings, down: int | None = None) -> Path:
    """Write nginx.conf and supervisord.conf into the run folder; returns supervisord.conf.
    Replica number `down` (1-based) is marked down in nginx's upstream. With `first_profile`,
    replica2 does not start with the others and is down until deploy/first_profile.py switches."""
    if s.first_profile and down is None:
        down = 2
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (s.run_dir / "nginx-tmp" / sub).mkdir(parents=True, exist_ok=True)
    replicas = []
    for i, (port, probe_port) in enumerate(zip(s.replica_ports, s.probe_ports, strict=True), 1):
        bind, address = s.replica_at(i)
        env = {"HOST": bind, "PORT": str(port), "PROBE_PORT": str(probe_port)}
        if s.preload:
            env["LD_PRELOAD"] = s.preload
        if s.accel == "gpu":  # one replica per GPU (not yet run on a GPU)
            env["CUDA_VISIBLE_DEVICES"] = str(i - 1)
        environment = ",".join(f"{k}={_supervisor_value(v)}" for k, v in env.items())
        replicas.append(
            {
                "name": f"replica{i}",
                "port": port,
                "probe_port": probe_port,
                "address": address,
                "prefix": s.command_prefix(f"replica{i}"),
                "environment": environment,
                "down": i == down,
                "autostart": not (s.first_profile and i == 2),
            }
        )
    values = {
        "root": ROOT,
        "run_dir": s.run_dir,
        "host": s.host,
        "port": s.port,
        "replicas": replicas,
        "nginx": require_tool("nginx"),
        "nginx_prefix": s.command_prefix("nginx"),
        # each program's parent-death signal: a supervisord killed with SIGKILL (which it cannot
        # pass on) still stops nginx and the gunicorns, which would otherwise serve on as orphans
        "orphan_guard": f"{require_tool('setpriv')} --pdeathsig TERM -- ",
        "gunicorn": require_tool("gunicorn"),
        "max_fails": MAX_FAILS,
        "next_upstream_tries": NEXT_UPSTREAM_TRIES,
        "next_upstream_timeout_s": NEXT_UPSTREAM_TIMEOUT_S,
        "fail_timeout_s": FAIL_TIMEOUT_S,
        "read_timeout_s": int(s.request_timeout_s) + 30,
        "max_body_bytes": s.max_body_bytes,
        "max_upload_bytes": s.max_upload_bytes,
        "client_timeout_s": s.client_timeout_s,
        # gunicorn's master kills a worker still draining at GRACEFUL_TIMEOUT; then it exits itself
        "stop_wait_s": s.graceful_timeout_s + 15,
        "halted_status": EXIT_STATUS,  # a master that stopped because its workers cannot start
        "logs_to_terminal": s.logs_to_terminal,
        "first_profile": s.first_profile,
        "python": sys.executable,
        "profile_environment": f"LD_PRELOAD={_supervisor_value(s.preload)}" if s.preload else "",
    }
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE), undefined=jinja2.StrictUndefined)
    for name in ("nginx.conf", "supervisord.conf"):
        (s.run_dir / name).write_text(env.get_template(f"{name}.j2").render(values) + "\n")
    return s.supervisord_conf
