"""A real gunicorn (deploy/server.py, the launcher the benchmark uses too): started with the
environment a test gives it and stopped after, the API key of the session's shared one, and what
its engines hold."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from deploy.server import Server

KEY = "test-key"  # one of the shared server's two API keys (`shared_server`)
STATIC_SERVER_QUEUE = 9  # `static_server`'s MAX_QUEUE, in sequences


def auth(key: str = KEY) -> dict:
    return {"Authorization": f"Bearer {key}"}


def json_auth(key: str = KEY) -> dict:
    """`auth` and the JSON Content-Type, for a body sent as raw bytes (every body route takes JSON only)."""
    return {**auth(key), "Content-Type": "application/json"}


@contextlib.contextmanager
def serving(folder: Path, env: dict[str, str], ready=("static", "vllm"), disabled=()) -> Iterator[Server]:
    """A real gunicorn (deploy/server.py) logging to `folder`/server.log, with `env` on top of
    ours, once the engines in `ready` are ready and those in `disabled` disabled; stopped after."""
    srv = Server(folder / "server.log", env)
    try:
        health = srv.wait_ready(900)
        for name in ready:
            assert health["engines"][name]["status"] == "ready", (health, srv.log_text()[-3000:])
        for name in disabled:
            assert health["engines"][name]["status"] == "disabled", health
        yield srv
    finally:
        srv.stop()


def nothing_held(server: Server) -> None:
    """Both engines ready, nothing queued, nothing in flight."""
    for name in ("static", "vllm"):
        engine = server.engine(name)
        assert engine["status"] == "ready" and engine["queued"] == 0 and engine["inflight"] == 0, engine
