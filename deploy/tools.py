"""The programs the cluster runs (nginx, gunicorn, supervisord, supervisorctl): where each is found."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def find_tool(name: str) -> str | None:
    """A tool from this venv first (supervisord, gunicorn), then PATH, then /usr/sbin (nginx)."""
    here = Path(sys.executable).with_name(name)
    return str(here) if here.exists() else shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def require_tool(name: str) -> str:
    """find_tool's answer, or an exit that says how to install the tool."""
    found = find_tool(name)
    if not found:
        raise SystemExit(f"{name} not found: `make setup` installs it (nginx with apt-get, as root)")
    return found
