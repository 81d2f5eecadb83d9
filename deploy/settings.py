"""The cluster's settings: read from the environment once, saved in the run folder by `run`, and
loaded from there by `rolling-restart`, so that both render the same configs."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from deploy.listen import DEFAULT_HOST, WILDCARDS

ROOT = Path(__file__).resolve().parent.parent
SETTINGS_FILE = "cluster.json"  # what `run` rendered with, for `rolling-restart` to render the same


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
    max_upload_bytes: int = (200 << 20) + (64 << 10)  # a file upload's body (Config.max_upload_bytes)
    # replica i binds, and nginx and the health checks reach it, at replica_hosts[i-1]; empty: every
    # replica at replica_host
    replica_hosts: tuple[str, ...] = ()
    # a prefix to a supervisord program's command ("nginx", "replica1", ...): e.g. "ip netns exec h1"
    prefixes: dict[str, str] = field(default_factory=dict)
    # `make serve` with no profile yet: replica2 waits, out of nginx, for deploy/first_profile.py
    first_profile: bool = False

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
            max_upload_bytes=config.max_upload_bytes,
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
