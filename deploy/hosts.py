"""Test hosts on this machine, and deploy/cluster.py's cluster spread over them.

A test host is a network namespace with an address of its own, joined to this machine (the root
namespace) by a veth pair on one bridge, so that the hosts, and this machine, reach each other
by address as machines on one network do. Needs root and iproute2 (`ip`). The addresses come from
one free /28 of 10.241.0.0/24 (this machine's end of the bridge takes its first address), so two
sets of hosts on one machine do not collide.

The cluster is deploy/cluster.py's, placed on the hosts by its settings (`place`): each program
started inside its host's namespace (`ip netns exec`), nginx listening on its host's address and
each replica bound to its own.

    with network(["lb", "h1", "h2"]) as hosts:
        placement = {"nginx": hosts["lb"], "replica1": hosts["h1"], "replica2": hosts["h2"]}
        s = place(Settings(...), placement)
        supervisord = subprocess.Popen(cluster.supervisord_command(s), ...)
        cluster.rolling_restart(s.run_dir, health_timeout_s=300)
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator

from deploy.settings import Settings

SUBNET = ipaddress.ip_network("10.241.0.0/24")
BLOCK_PREFIX = 28  # one block per set of hosts: this machine's end and up to 13 hosts
IP_TIMEOUT_S = 30


@dataclasses.dataclass(frozen=True)
class Host:
    name: str  # as the caller calls it: "lb", "h1"
    netns: str
    address: str


def ip_tool() -> str | None:
    return shutil.which("ip") or shutil.which("ip", path="/usr/sbin:/sbin")


def unavailable() -> str | None:
    """Why no test hosts can be made here, or None: they need root and `ip netns`."""
    if os.geteuid() != 0:
        return "test hosts need root (ip netns, veth)"
    if ip_tool() is None:
        return "`ip` not found (Debian's iproute2)"
    probe = f"llmprobe{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as e:
        return f"`ip netns add` fails here: {e.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _ip(*args: str, check: bool = True) -> str:
    done = subprocess.run([ip_tool() or "ip", *args], check=check, capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    return done.stdout


def _free_block() -> ipaddress.IPv4Network:
    """The first /28 of SUBNET that no interface here has an address in."""
    taken = [ipaddress.ip_interface(word).network for word in re.findall(r"inet (\S+)", _ip("-o", "-4", "addr"))]
    for block in SUBNET.subnets(new_prefix=BLOCK_PREFIX):
        if not any(block.overlaps(net) for net in taken):
            return block
    raise RuntimeError(f"no free /{BLOCK_PREFIX} left in {SUBNET}")


@contextlib.contextmanager
def network(names: list[str]) -> Iterator[dict[str, Host]]:
    """One test host per name, each a namespace on a fresh bridge here; all removed on exit, made
    or half made. Whatever runs inside them must have stopped by then."""
    block = _free_block()
    addresses = list(block.hosts())
    if len(names) >= len(addresses) or any(not 0 < len(name) <= 8 for name in names):
        raise ValueError(f"1 to {len(addresses) - 1} hosts, each named in 1-8 characters: {names}")
    tag = secrets.token_hex(2)  # interface names: 15 characters at most
    bridge = f"llm{tag}br"
    hosts = {
        name: Host(name, f"llm{tag}{name}", str(address)) for name, address in zip(names, addresses[1:], strict=False)
    }
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{addresses[0]}/{BLOCK_PREFIX}", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for host in hosts.values():
            _plug(host, bridge)
        yield hosts
    finally:
        for host in hosts.values():  # its end of the veth goes with it, and so the other end
            _ip("netns", "del", host.netns, check=False)
        _ip("link", "del", bridge, check=False)


def _plug(host: Host, bridge: str) -> None:
    """The host's namespace, its `eth0` on the bridge with its address, and its loopback, all up."""
    _ip("netns", "add", host.netns)
    _ip("link", "add", host.netns, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
    _ip("link", "set", host.netns, "master", bridge, "up")
    _ip("-n", host.netns, "addr", "add", f"{host.address}/{BLOCK_PREFIX}", "dev", "eth0")
    _ip("-n", host.netns, "link", "set", "eth0", "up")
    _ip("-n", host.netns, "link", "set", "lo", "up")


def place(s: Settings, placement: dict[str, Host]) -> Settings:
    """`s` with each of its programs on its host (`placement`: supervisord program name, "nginx",
    "replica1", ..., to host): nginx listening on its host's address, replica i bound to its host's
    address on s.port + i, each command run in its host's namespace."""
    programs = ["nginx", *(f"replica{i}" for i in range(1, s.replicas + 1))]
    if sorted(placement) != sorted(programs):
        raise ValueError(f"place each of {programs}, got {sorted(placement)}")
    return dataclasses.replace(
        s,
        host=placement["nginx"].address,
        replica_hosts=tuple(placement[name].address for name in programs[1:]),
        prefixes={name: f"{ip_tool()} netns exec {host.netns}" for name, host in placement.items()},
    )
