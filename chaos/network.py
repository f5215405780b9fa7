"""A private network for one chaos run: a namespace per process, veths to a bridge, link faults.

``partition`` and ``slow_link`` need a link that can be cut or shaped between one group and
everyone else, which loopback cannot give. So, for runs with those faults, every process (the
lighthouse and each group) runs in its own network namespace whose ``eth0`` is one end of a
veth pair; the other end is a port of a bridge in a further namespace::

      ns <prefix>-lh   eth0 10.88.0.1  ──veth── vlh ┐
      ns <prefix>-g0   eth0 10.88.0.10 ──veth── vg0 ├─ br0   (ns <prefix>-br)
      ns <prefix>-g1   eth0 10.88.0.11 ──veth── vg1 ┘

Nothing is added to the host's own namespace (no address, no route, no interface), so a run
cannot disturb the machine or another run, and two runs may use the same addresses. Every
namespace name carries a per-run prefix; ``close()`` deletes them all (their veths and the
bridge go with them).

A partition sets the bridge-side end down: packets in both directions are dropped, and open
TCP connections stall rather than reset, which is what a real partition looks like. A slow
link is a qdisc on both ends: ``tbf`` for a bandwidth cap, ``netem`` for a delay (a kernel
without the netem module cannot delay; that is reported, never approximated).

Considered and rejected: iptables DROP rules (not installed here, and the link is the
cleaner switch); one bridge in the host namespace (it would need host addresses and routes).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)

SUBNET = "10.88.0"
LIGHTHOUSE = "lh"
"""Host name of the lighthouse inside the lab."""
BRIDGE = "br0"
COMMAND_TIMEOUT_S = 10.0
LINK_UP_TIMEOUT_S = 10.0
"""How long a restored link may take to carry traffic again: the kernel reports a veth's
carrier coming up asynchronously (its link watch batches such events for up to a second)."""
_runs = itertools.count()


class NetworkUnavailable(RuntimeError):
    """The namespaces, veths, bridge or a qdisc cannot be created here; the message says which command failed."""


@dataclass(frozen=True, slots=True)
class Host:
    name: str
    """``lh`` for the lighthouse, else the group's replica id."""
    namespace: str
    address: str
    port: str
    """The bridge-side end of this host's veth, in the bridge namespace."""


def plan_hosts(prefix: str, group_ids: Sequence[str]) -> dict[str, Host]:
    """Namespaces and addresses: the lighthouse at ``.1``, group i at ``.(10 + i)``. Pure."""
    if len(group_ids) > 200:
        raise ValueError(f"{len(group_ids)} groups do not fit in {SUBNET}.0/24 (at most 200)")
    hosts = {LIGHTHOUSE: Host(LIGHTHOUSE, f"{prefix}-{LIGHTHOUSE}", f"{SUBNET}.1", f"v{LIGHTHOUSE}")}
    for i, gid in enumerate(group_ids):
        hosts[gid] = Host(gid, f"{prefix}-{gid}", f"{SUBNET}.{10 + i}", f"v{gid}"[:15])
    return hosts


def shaping_qdisc(rate_mbit: float | None, delay_ms: float | None) -> list[str]:
    """The ``tc qdisc add dev X root ...`` tail for a link capped at ``rate_mbit`` and/or delayed by ``delay_ms``.
    Pure."""
    if delay_ms is not None:
        args = ["netem", "delay", f"{delay_ms:g}ms"]
        if rate_mbit is not None:
            args += ["rate", f"{rate_mbit:g}mbit"]
        return args
    if rate_mbit is None:
        raise ValueError("a slow link needs rate_mbit or delay_ms")
    # tbf needs a bucket of at least one timer tick's worth of bytes; 10 ms at the rate, 4 KiB minimum.
    burst = max(4096, int(rate_mbit * 1e6 / 8 / 100))
    return ["tbf", "rate", f"{rate_mbit:g}mbit", "burst", str(burst), "latency", "1s"]


class NetworkLab:
    """The namespaces of one run. ``create()`` builds them; ``close()`` always tears them down."""

    def __init__(self, group_ids: Sequence[str], *, prefix: str | None = None) -> None:
        self.prefix = prefix or f"rftchaos{os.getpid()}x{next(_runs)}"
        self.bridge_namespace = f"{self.prefix}-br"
        self.hosts = plan_hosts(self.prefix, group_ids)
        self._created: list[str] = []
        self._shaped: set[str] = set()

    def _ip(self, *args: str) -> str:
        cmd = ["ip", *args]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise NetworkUnavailable(f"`{' '.join(cmd)}` could not run: {e}") from e
        if done.returncode != 0:
            raise NetworkUnavailable(f"`{' '.join(cmd)}` failed (exit {done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def _tc(self, namespace: str, *args: str) -> None:
        self._ip("netns", "exec", namespace, "tc", *args)

    def create(self) -> None:
        """Build the bridge and every host; raises NetworkUnavailable (after undoing what was built)."""
        try:
            self._ip("netns", "add", self.bridge_namespace)
            self._created.append(self.bridge_namespace)
            self._ip("-n", self.bridge_namespace, "link", "set", "lo", "up")
            self._ip("-n", self.bridge_namespace, "link", "add", BRIDGE, "type", "bridge")
            self._ip("-n", self.bridge_namespace, "link", "set", BRIDGE, "up")
            for host in self.hosts.values():
                self._add_host(host)
        except NetworkUnavailable:
            self.close()
            raise
        logger.info("network lab %s: %s", self.prefix, ", ".join(f"{h.name}={h.address}" for h in self.hosts.values()))

    def _add_host(self, host: Host) -> None:
        self._ip("netns", "add", host.namespace)
        self._created.append(host.namespace)
        self._ip(
            "link",
            "add",
            "name",
            "eth0",
            "netns",
            host.namespace,
            "type",
            "veth",
            "peer",
            "name",
            host.port,
            "netns",
            self.bridge_namespace,
        )
        self._ip("-n", self.bridge_namespace, "link", "set", host.port, "master", BRIDGE)
        self._ip("-n", self.bridge_namespace, "link", "set", host.port, "up")
        self._ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
        self._ip("-n", host.namespace, "link", "set", "eth0", "up")
        self._ip("-n", host.namespace, "link", "set", "lo", "up")

    def wrap(self, name: str, args: Sequence[str]) -> list[str]:
        """``args`` run inside host ``name``'s namespace (``ip netns exec`` execs: same pid)."""
        return ["ip", "netns", "exec", self.hosts[name].namespace, *args]

    def address(self, name: str) -> str:
        return self.hosts[name].address

    def cut(self, name: str) -> None:
        """Partition host ``name``: its bridge port goes down, both directions drop."""
        self._ip("-n", self.bridge_namespace, "link", "set", self.hosts[name].port, "down")

    def restore(self, name: str) -> None:
        """Undo :meth:`cut`, returning once the link carries traffic: both veth ends up and the
        bridge port forwarding, and no neighbour entry left failed by the cut (a connection
        started sooner lost its first SYN and waited a second to resend it)."""
        host = self.hosts[name]
        self._ip("-n", self.bridge_namespace, "link", "set", host.port, "up")
        deadline = time.monotonic() + LINK_UP_TIMEOUT_S
        while not self._carries(host):
            if time.monotonic() > deadline:
                raise NetworkUnavailable(
                    f"the link of {name} ({host.port}) was not forwarding {LINK_UP_TIMEOUT_S:g}s after it was set up"
                )
            time.sleep(0.01)  # polls the kernel's link state, an observable event
        for other in self.hosts.values():
            if other is not host and self._has_neighbour(other.namespace, host.address):
                self._ip("-n", other.namespace, "neigh", "flush", "dev", "eth0", "to", host.address)
        if self._has_neighbour(host.namespace, None):
            self._ip("-n", host.namespace, "neigh", "flush", "dev", "eth0")

    def _carries(self, host: Host) -> bool:
        (port,) = json.loads(self._ip("-d", "-j", "-n", self.bridge_namespace, "link", "show", "dev", host.port))
        (eth0,) = json.loads(self._ip("-j", "-n", host.namespace, "link", "show", "dev", "eth0"))
        state = port.get("linkinfo", {}).get("info_slave_data", {}).get("state")
        return port.get("operstate") == "UP" and eth0.get("operstate") == "UP" and state in ("forwarding", None)

    def _has_neighbour(self, namespace: str, address: str | None) -> bool:
        """Whether ``namespace`` has a neighbour entry on eth0 (for ``address``; any when None):
        ``ip neigh flush`` fails when there is nothing to flush."""
        entries = json.loads(self._ip("-j", "-n", namespace, "neigh", "show", "dev", "eth0") or "[]")
        return any(address is None or e.get("dst") == address for e in entries)

    def shape(self, name: str, rate_mbit: float | None, delay_ms: float | None) -> None:
        """Slow host ``name``'s link both ways; raises NetworkUnavailable (e.g. no netem) having shaped nothing."""
        host, qdisc = self.hosts[name], shaping_qdisc(rate_mbit, delay_ms)
        self._tc(host.namespace, "qdisc", "add", "dev", "eth0", "root", *qdisc)
        try:
            self._tc(self.bridge_namespace, "qdisc", "add", "dev", host.port, "root", *qdisc)
        except NetworkUnavailable:
            self._tc(host.namespace, "qdisc", "del", "dev", "eth0", "root")
            raise
        self._shaped.add(name)

    def unshape(self, name: str) -> None:
        host = self.hosts[name]
        self._shaped.discard(name)
        self._tc(host.namespace, "qdisc", "del", "dev", "eth0", "root")
        self._tc(self.bridge_namespace, "qdisc", "del", "dev", host.port, "root")

    def close(self) -> list[str]:
        """Delete every namespace this lab created; returns the failures (also logged)."""
        failures = []
        for namespace in reversed(self._created):
            try:
                self._ip("netns", "del", namespace)
            except NetworkUnavailable as e:
                failures.append(str(e))
                logger.error("network lab %s: %s", self.prefix, e)
        self._created.clear()
        return failures
