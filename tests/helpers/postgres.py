"""A real PostgreSQL for the tests that share the batch store past one machine: a cluster of its
own (initdb, pg_ctl) on a free loopback port, trusting local connections, stopped after; and a
fresh database in it per test (pytest-postgresql's DatabaseJanitor). Where it cannot run, the test
skips saying why: no server binaries, no psycopg, or a server that does not start.

PostgreSQL refuses to run as root: run by root (a container), the server runs as the `postgres`
user Debian's package makes (`runuser`), in a folder of its own outside root's private tmp."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator

import pytest

from deploy.server import free_port_run

USER = "postgres"  # the cluster's superuser, and the system user it runs as under root


def _binary(name: str) -> str | None:
    """`name` on PATH, else in Debian's versioned folder (postgresql-NN puts none on PATH)."""
    return shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)


def _as_server_user() -> list[str]:
    """The command prefix that runs the server's tools as a user PostgreSQL accepts."""
    if os.geteuid() != 0:
        return []
    runuser = shutil.which("runuser")
    try:
        pwd.getpwnam(USER)
    except KeyError:
        runuser = None
    if runuser is None:
        pytest.skip(f"running as root, and no `{USER}` user or no runuser to run PostgreSQL as (it refuses root)")
    return [runuser, "-u", USER, "--"]


@contextlib.contextmanager
def postgres_server() -> Iterator[tuple[str, int]]:
    """A started PostgreSQL: (host, port), its superuser USER without a password; stopped after."""
    pytest.importorskip("psycopg", reason="psycopg (requirements.txt) is not installed")
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl): Debian's postgresql package has them")
    prefix = _as_server_user()
    folder = tempfile.mkdtemp(prefix="batcher-test-pg-")
    if prefix:
        shutil.chown(folder, USER, USER)
    data, log = os.path.join(folder, "data"), os.path.join(folder, "server.log")
    port = free_port_run()
    options = f"-F -p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={folder} -c max_connections=200"
    try:
        for command in (
            [initdb, "-D", data, "-U", USER, "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8"],
            [pg_ctl, "start", "-w", "-t", "60", "-D", data, "-l", log, "-o", options],
        ):
            done = subprocess.run(prefix + command, capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                tail = open(log).read()[-2000:] if os.path.exists(log) else ""
                pytest.skip(f"PostgreSQL did not start ({os.path.basename(command[0])}): {done.stderr[-2000:]}{tail}")
        yield "127.0.0.1", port
    finally:
        if os.path.exists(os.path.join(data, "postmaster.pid")):
            subprocess.run(prefix + [pg_ctl, "stop", "-D", data, "-m", "immediate"], capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def database(server: tuple[str, int]) -> Iterator[str]:
    """A new, empty database on `server`, as a DATABASE_URL; dropped after (its connections cut)."""
    from pytest_postgresql.janitor import DatabaseJanitor

    host, port = server
    name = f"batches_{uuid.uuid4().hex[:12]}"
    with DatabaseJanitor(user=USER, host=host, port=port, dbname=name):
        yield f"postgresql+psycopg://{USER}@{host}:{port}/{name}"
