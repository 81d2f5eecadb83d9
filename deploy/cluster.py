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
import ipaddress
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from deploy.starts import EXIT_STATUS

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
MAX_FAILS = 3
FAIL_TIMEOUT_S = 5
SETTINGS_FILE = "cluster.json"  # what `run` rendered with, for `rolling-restart` to render the same
# Where nginx, the replicas and plain gunicorn (gunicorn.conf.py) listen unless HOST (REPLICA_HOST)
# says otherwise: safe by default, since the service has no API key unless one is set.
DEFAULT_HOST = "127.0.0.1"
WILDCARDS = ("0.0.0.0", "", "::")  # a replica bound to one is reached on this machine at DEFAULT_HOST
# nginx resends a refused request at most once more (proxy_next_upstream_tries counts the first
# try), and only within this many seconds of its first: a replica refuses in milliseconds, so a
# later failure is not a refusal, and a second refusal says the cluster is full (the client has
# Retry-After). deploy/nginx.conf.j2 says which failures are resent.
NEXT_UPSTREAM_TRIES = 2
NEXT_UPSTREAM_TIMEOUT_S = 10


def is_loopback(host: str) -> bool:
    """Reachable from this machine alone: 127.0.0.0/8, ::1 or localhost."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a name, not an address
        return host.lower() == "localhost"


def warn_if_open(log: logging.Logger, what: str, host: str, port: int, has_api_key: bool) -> bool:
    """Warn that anyone who reaches `host` may generate: it is beyond loopback and API_KEY unset."""
    if is_loopback(host) or has_api_key:
        return False
    log.warning(
        "%s listens on %s:%d, beyond loopback, with no API_KEY: anyone who reaches it may generate."
        " Set API_KEY, or HOST=127.0.0.1 for this machine alone",
        what,
        host,
        port,
    )
    return True


@dataclass(frozen=True)
class Settings:
    host: str
    port: int
    replicas: int
    run_dir: Path
    graceful_timeout_s: int
    request_timeout_s: float
    max_body_bytes: int
    client_timeout_s: int  # nginx waits this long for a request's headers, and between two reads of its body
    accel: str
    preload: str
    replica_host: str = DEFAULT_HOST  # where the replicas bind (REPLICA_HOST: e.g. for /metrics per replica)
    logs_to_terminal: bool = False  # the replicas' output on supervisord's stdout, not in files
    has_api_key: bool = False  # API_KEY set (the warning about a listener beyond loopback)
    # replica i binds, and nginx and the health checks reach it, at replica_hosts[i-1]; empty: every
    # replica at replica_host
    replica_hosts: tuple[str, ...] = ()
    # a prefix to a supervisord program's command ("nginx", "replica1", ...): e.g. "ip netns exec h1"
    prefixes: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.replica_hosts and len(self.replica_hosts) != self.replicas:
            raise ValueError(f"{len(self.replica_hosts)} replica_hosts for {self.replicas} replicas")
        unknown = set(self.prefixes) - {"nginx", *(f"replica{i}" for i in range(1, self.replicas + 1))}
        if unknown:
            raise ValueError(f"prefixes for no such program: {sorted(unknown)}")

    @classmethod
    def from_env(cls) -> Settings:
        """The cluster's own knobs; the service's (REQUEST_TIMEOUT_S, MAX_BODY_BYTES) as its Config
        reads them, defaults included (imported here: `service` loads torch, the module need not)."""
        from service.config import Config

        config = Config.from_env()  # SettingError names a setting out of its range
        port, replicas = config.port, config.replicas
        return cls(
            host=os.environ.get("HOST") or DEFAULT_HOST,
            port=port,
            replicas=replicas,
            run_dir=Path(os.environ.get("CLUSTER_DIR") or ROOT / ".cache" / "cluster" / str(port)).resolve(),
            graceful_timeout_s=config.graceful_timeout,  # gunicorn.conf.py reads the same field
            request_timeout_s=config.request_timeout_s,
            max_body_bytes=config.max_body_bytes,
            client_timeout_s=config.client_timeout_s,
            accel=os.environ.get("ACCEL", "cpu"),
            preload=os.environ.get("REPLICA_PRELOAD", ""),
            replica_host=os.environ.get("REPLICA_HOST") or DEFAULT_HOST,
            has_api_key=bool(config.api_keys),
        )

    def save(self) -> None:
        values = {**dataclasses.asdict(self), "run_dir": str(self.run_dir)}
        (self.run_dir / SETTINGS_FILE).write_text(json.dumps(values, indent=1) + "\n")

    @classmethod
    def load(cls, run_dir: Path) -> Settings:
        values = json.loads((run_dir / SETTINGS_FILE).read_text())
        replica_hosts = tuple(values.pop("replica_hosts", ()))  # a list in JSON
        return cls(**{**values, "run_dir": Path(values["run_dir"]), "replica_hosts": replica_hosts})

    @property
    def replica_ports(self) -> list[int]:
        return [self.port + i for i in range(1, self.replicas + 1)]

    @property
    def probe_ports(self) -> list[int]:
        """Replica i's probe server (PROBE_PORT, deploy/probe.py): the REPLICAS ports after theirs."""
        return [self.port + self.replicas + i for i in range(1, self.replicas + 1)]

    def replica_at(self, i: int) -> tuple[str, str]:
        """Replica i's (1-based) host: where it binds, and the address nginx and the health checks
        reach it at (this machine's loopback for a wildcard)."""
        bind = self.replica_hosts[i - 1] if self.replica_hosts else self.replica_host
        return bind, DEFAULT_HOST if bind in WILDCARDS else bind

    def command_prefix(self, program: str) -> str:
        """What goes before the program's command in supervisord.conf: its prefix and a space, or ""."""
        prefix = self.prefixes.get(program, "")
        return f"{prefix} " if prefix else ""

    @property
    def supervisord_conf(self) -> Path:
        return self.run_dir / "supervisord.conf"


def _supervisor_value(value: str) -> str:
    """A value for supervisord's `environment=`: quoted, and % doubled (its own expansion)."""
    return '"' + value.replace("%", "%%").replace('"', '\\"') + '"'


def find_tool(name: str) -> str | None:
    """A tool from this venv first (supervisord, gunicorn), then PATH, then /usr/sbin (nginx)."""
    here = Path(sys.executable).with_name(name)
    return str(here) if here.exists() else shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def _tool(name: str) -> str:
    found = find_tool(name)
    if not found:
        raise SystemExit(f"{name} not found: `make setup` installs it (nginx with apt-get, as root)")
    return found


def render(s: Settings, down: int | None = None) -> Path:
    """Write nginx.conf and supervisord.conf into the run folder; returns supervisord.conf.
    Replica number `down` (1-based) is marked down in nginx's upstream."""
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
            }
        )
    values = {
        "root": ROOT,
        "run_dir": s.run_dir,
        "host": s.host,
        "port": s.port,
        "replicas": replicas,
        "nginx": _tool("nginx"),
        "nginx_prefix": s.command_prefix("nginx"),
        "gunicorn": _tool("gunicorn"),
        "max_fails": MAX_FAILS,
        "next_upstream_tries": NEXT_UPSTREAM_TRIES,
        "next_upstream_timeout_s": NEXT_UPSTREAM_TIMEOUT_S,
        "fail_timeout_s": FAIL_TIMEOUT_S,
        "read_timeout_s": int(s.request_timeout_s) + 30,
        "max_body_bytes": s.max_body_bytes,
        "client_timeout_s": s.client_timeout_s,
        # gunicorn's master kills a worker still draining at GRACEFUL_TIMEOUT; then it exits itself
        "stop_wait_s": s.graceful_timeout_s + 15,
        "halted_status": EXIT_STATUS,  # a master that stopped because its workers cannot start
        "logs_to_terminal": s.logs_to_terminal,
    }
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE), undefined=jinja2.StrictUndefined)
    for name in ("nginx.conf", "supervisord.conf"):
        (s.run_dir / name).write_text(env.get_template(f"{name}.j2").render(values) + "\n")
    return s.supervisord_conf


def supervisord_command(s: Settings) -> list[str]:
    """All `run` does before it becomes supervisord (the warning, the configs, the settings that
    `rolling-restart` renders from); returns supervisord's command line, for a caller that runs
    the cluster as its child (tests/e2e/test_hosts.py)."""
    warn_if_open(logging.getLogger("deploy.cluster"), "nginx", s.host, s.port, s.has_api_key)
    conf = render(s)
    s.save()
    replicas = ", ".join(f"{s.replica_at(i)[1]}:{port}" for i, port in enumerate(s.replica_ports, 1))
    print(f"cluster: nginx on {s.host}:{s.port}, gunicorn on {replicas}; logs in {s.run_dir}", flush=True)
    return [_tool("supervisord"), "-n", "-c", str(conf)]


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
        gunicorn, env = _tool("gunicorn"), {**os.environ, "HOST": s.host, "PORT": str(s.port)}
        if s.preload:
            env["LD_PRELOAD"] = s.preload
        os.chdir(ROOT)
        os.execve(gunicorn, [gunicorn, "-c", "gunicorn.conf.py", "wsgi:app"], env)
    else:
        run(dataclasses.replace(s, replicas=1, replica_host=DEFAULT_HOST, logs_to_terminal=True))


def healthy(address: str, port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}:{port}/health", timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_healthy(address: str, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not healthy(address, port):
        if time.monotonic() > deadline:
            raise SystemExit(f"replica on :{port} not healthy after {timeout_s:.0f}s; stopping the rolling restart")
        time.sleep(0.5)


def rolling_restart(run_dir: Path, health_timeout_s: float) -> dict[str, float]:
    """Restart the replicas one at a time; returns each one's seconds from out of nginx to back in.

    Each replica leaves nginx's upstream first (`down`, then a graceful reload: nginx finishes what
    it sent there), so it gets no new requests while it drains and loads; requests already on
    their way get its 503 and go to another replica. It comes back once its /health answers 200
    (the reload also clears any failures nginx counted against it)."""
    if not (run_dir / SETTINGS_FILE).exists():
        raise SystemExit(f"no cluster at {run_dir} (start one with `make cluster`, same PORT)")
    s = Settings.load(run_dir)
    supervisorctl = _tool("supervisorctl")

    def ctl(*args: str) -> None:
        subprocess.run(
            [supervisorctl, "-c", str(s.supervisord_conf), *args],
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=s.graceful_timeout_s + 60,  # a restart waits for the drain
        )

    started, seconds = time.monotonic(), {}
    for i, port in enumerate(s.replica_ports, 1):  # never take one out while another is unhealthy
        wait_healthy(s.replica_at(i)[1], port, health_timeout_s)
    for i, port in enumerate(s.replica_ports, 1):
        t0 = time.monotonic()
        render(s, down=i)
        ctl("signal", "HUP", "nginx")
        ctl("restart", f"replicas:replica{i}")  # SIGTERM: it drains and exits 0; then it starts again
        restarted = time.monotonic() - t0
        wait_healthy(s.replica_at(i)[1], port, health_timeout_s)
        render(s)
        ctl("signal", "HUP", "nginx")
        seconds[f"replica{i}"] = time.monotonic() - t0
        print(
            f"rolling-restart: replica{i} (:{port}) drained and restarted in {restarted:.1f}s, "
            f"healthy and back in nginx after {seconds[f'replica{i}']:.1f}s",
            flush=True,
        )
    print(f"rolling-restart: {s.replicas} replicas restarted in {time.monotonic() - started:.1f}s", flush=True)
    return seconds


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
