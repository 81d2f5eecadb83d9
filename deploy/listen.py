"""Where nginx, the replicas and plain gunicorn listen unless told otherwise, and the warning when
a listener is open beyond loopback with no API key."""

from __future__ import annotations

import ipaddress
import logging

# Where nginx, the replicas and plain gunicorn (gunicorn.conf.py) listen unless HOST (REPLICA_HOST)
# says otherwise: safe by default, since the service has no API key unless one is set.
DEFAULT_HOST = "127.0.0.1"
WILDCARDS = ("0.0.0.0", "", "::")  # a replica bound to one is reached on this machine at DEFAULT_HOST


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
