"""Failpoints: named places in the engine threads where a test, or an operator rehearsing a
failure, injects a fault without editing the code (the idea of FreeBSD's fail(9), etcd's gofail).

    FAILPOINTS="static.round=raise"          the static engine thread raises before its next round
    FAILPOINTS="vllm.step=hang"              the vLLM engine thread blocks before its next step
    FAILPOINTS="vllm.step=raise@3"           ... at the third time it gets there, once
    FAILPOINTS="static.load=raise"           the static engine's load raises (in every fresh process)

A point fires once, at its Nth hit (1 unless `@N`); `arm()` and `disarm()` do the same in process.
`hang` blocks until `disarm()` (in process), or for good. With FAILPOINTS unset, `hit()` is one
dict lookup on an empty dict.

The points: `static.round` (the static engine, before it runs a round) and `vllm.step` (the vLLM
engine, before a step). Both sit outside the per-round and per-step guards, so a fault there is a
fault of the engine thread itself: what batcher/engine.py's crash-only handling is for. And
`static.load`, `vllm.load`: first in each engine's load, before any model is read, so a failed
start costs a test little. Each process arms its own points from FAILPOINTS: under gunicorn every
fresh worker fails its load again, as a fault that a fresh process does not cure would.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

ACTIONS = ("raise", "hang")


class InjectedFault(RuntimeError):
    """What a `raise` failpoint raises."""


@dataclass
class _Point:
    action: str
    at: int = 1  # fires at this hit
    hits: int = 0
    released: threading.Event = field(default_factory=threading.Event)


_points: dict[str, _Point] = {}
_lock = threading.Lock()


def parse(spec: str) -> dict[str, tuple[str, int]]:
    """`name=action[@n],...` -> {name: (action, n)}; ValueError naming what is wrong."""
    out = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, rest = item.partition("=")
        action, _, at = rest.partition("@")
        if not name or action not in ACTIONS or (at and not at.isdigit()) or at == "0":
            raise ValueError(f"FAILPOINTS: {item!r} is not name=raise|hang[@n] (n >= 1)")
        out[name.strip()] = (action, int(at or 1))
    return out


def arm(name: str, action: str, at: int = 1) -> None:
    if action not in ACTIONS:
        raise ValueError(f"failpoint action must be one of {ACTIONS}, got {action!r}")
    with _lock:
        _points[name] = _Point(action, at)
    log.warning("failpoint %s armed: %s at hit %d", name, action, at)


def disarm(name: str | None = None) -> None:
    """Disarm one point (every point: None); a thread hanging at it goes on."""
    with _lock:
        names = list(_points) if name is None else [name]
        for point in filter(None, (_points.pop(n, None) for n in names)):
            point.released.set()


def hit(name: str) -> None:
    """Called by an engine thread at the point `name`: does nothing unless it is armed."""
    point = _points.get(name)
    if point is None:
        return
    with _lock:
        point.hits += 1
        fires = point.hits == point.at
    if not fires:
        return
    log.warning("failpoint %s fires: %s", name, point.action)
    if point.action == "raise":
        raise InjectedFault(f"failpoint {name} injected a fault")
    point.released.wait()


for _name, (_action, _at) in parse(os.environ.get("FAILPOINTS", "")).items():
    arm(_name, _action, _at)
