"""A job across three "hosts": network namespaces joined by a bridge, as separate machines are.

Every other integration test runs on loopback, where an address mistake is invisible: a group
that advertises ``127.0.0.1`` for its store or state server is still reachable by its peers.
Here each host is a network namespace with its own loopback and one veth to a bridge, so a
peer can reach it only at the address it was given::

      ns <run>-a   eth0 10.99.0.1  lighthouse ──veth── va ┐
      ns <run>-b   eth0 10.99.0.2  group g0   ──veth── vb ├─ br0   (ns <run>-br)
      ns <run>-c   eth0 10.99.0.3  group g1   ──veth── vc ┘

Nothing is added to the test machine's own namespace (no address, route or interface), so
the fixed addresses and the lighthouse's fixed port cannot collide with anything else, and
every name carries a per-run prefix, so concurrent runs do not collide either. Each group
runs as deploy/torchrun.md tells a real host to: ``REPLICAFT_HOST`` is the host's routable
address (where peers reach its store and state server), ``REPLICAFT_LIGHTHOUSE`` is the
lighthouse host's address, and ``GLOO_SOCKET_IFNAME`` names the interface Gloo binds (by
default it binds whatever the hostname resolves to, which is not this namespace's address).

Needs root and ``ip``; where a namespace cannot be created the test is skipped, saying why.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import PYTHON, REPO_ROOT, ManagedProcess, kill_all, spawn
from support.training_events import (
    EXAMPLE,
    assert_digests_agree,
    assert_samples_exactly_once,
    read_events,
    wait_for_event,
)

pytestmark = pytest.mark.slow

SUBNET = "10.99.0"
LIGHTHOUSE_PORT = 29510
"""Fixed, as on a real cluster: the lighthouse's namespace has no other listener."""
IP_TIMEOUT_S = 10.0
STEPS = 30
"""Committed steps each group trains; g1 is killed at step 10."""


class NamespaceUnavailable(RuntimeError):
    """An ``ip`` command failed; the message names it and its error output."""


@dataclass(frozen=True, slots=True)
class Host:
    namespace: str
    address: str

    def command(self, *args: str) -> list[str]:
        """``args`` run inside this host (``ip netns exec`` execs, so the pid is the program's)."""
        return ["ip", "netns", "exec", self.namespace, *args]


def ip(*args: str) -> None:
    cmd = ["ip", *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NamespaceUnavailable(f"`{' '.join(cmd)}` could not run: {e}") from e
    if done.returncode != 0:
        raise NamespaceUnavailable(f"`{' '.join(cmd)}` failed (exit {done.returncode}): {done.stderr.strip()}")


@contextmanager
def hosts_on_a_bridge(names: tuple[str, ...]) -> Iterator[dict[str, Host]]:
    """Namespaces ``names`` (addresses .1, .2, ...) on one bridge; torn down on exit.

    Skips the test when the first namespace cannot be created (no root, no ``ip``, no
    CAP_SYS_ADMIN in a container); any later failure is a real error. On exit every process
    the test started is killed first, then the namespaces are deleted (their veths and the
    bridge go with them).
    """
    prefix = f"rftmh{uuid.uuid4().hex[:8]}"
    bridge = f"{prefix}-br"
    created: list[str] = []
    try:
        try:
            ip("netns", "add", bridge)
        except NamespaceUnavailable as e:
            pytest.skip(f"cannot create network namespaces here (needs root and iproute2): {e}")
        created.append(bridge)
        ip("-n", bridge, "link", "add", "br0", "type", "bridge")
        ip("-n", bridge, "link", "set", "br0", "up")
        hosts = {}
        for i, name in enumerate(names, start=1):
            host = Host(f"{prefix}-{name}", f"{SUBNET}.{i}")
            ip("netns", "add", host.namespace)
            created.append(host.namespace)
            port = f"v{name}"
            ip(
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
                port,
                "netns",
                bridge,
            )
            ip("-n", bridge, "link", "set", port, "master", "br0")
            ip("-n", bridge, "link", "set", port, "up")
            ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
            ip("-n", host.namespace, "link", "set", "eth0", "up")
            # Processes bind loopback too (Gloo probes, local servers): it starts down in a new namespace.
            ip("-n", host.namespace, "link", "set", "lo", "up")
            hosts[name] = host
        yield hosts
    finally:
        kill_all()
        for namespace in reversed(created):
            ip("netns", "del", namespace)


def host_env(**variables: str) -> Mapping[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPLICAFT_")}
    env.update(variables, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO_ROOT))
    return env


def start_lighthouse_on(host: Host) -> ManagedProcess:
    args = ["-m", "lighthouse", "--host", host.address, "--port", str(LIGHTHOUSE_PORT), "--min-replicas", "2"]
    process = spawn(host.command(PYTHON, *args), name="lighthouse", env=host_env())
    expected = f"lighthouse serving gRPC at {host.address}:{LIGHTHOUSE_PORT}"
    process.wait_for_line(lambda text: text == expected, 60, what=f"'{expected}'")
    return process


def start_group_on(host: Host, lighthouse: Host, replica_id: str, events: Path) -> ManagedProcess:
    env = host_env(
        REPLICAFT_LIGHTHOUSE=f"{lighthouse.address}:{LIGHTHOUSE_PORT}",
        REPLICAFT_REPLICA_ID=replica_id,
        REPLICAFT_HOST=host.address,
        REPLICAFT_EVENTS_DIR=str(events),
        GLOO_SOCKET_IFNAME="eth0",
    )
    args = [EXAMPLE, "--steps", str(STEPS), "--step-delay", "0.02"]
    return spawn(host.command(PYTHON, *args), name=f"{replica_id}@{host.address}", env=env)


@pytest.mark.timeout(180)
def test_group_killed_on_its_host_restarts_and_heals_across_the_network(tmp_path: Path) -> None:
    with hosts_on_a_bridge(("a", "b", "c")) as hosts:
        # --min-replicas 2 holds g0 at the step boundary while g1 is down, however slowly a
        # loaded machine restarts it, so g1 always has a peer ahead of it to heal from.
        start_lighthouse_on(hosts["a"])
        groups = {
            "g0": start_group_on(hosts["b"], hosts["a"], "g0", tmp_path),
            "g1": start_group_on(hosts["c"], hosts["a"], "g1", tmp_path),
        }
        wait_for_event(
            tmp_path,
            lambda e: e["event"] == "commit" and e["replica_id"] == "g1" and e["step"] >= 10,
            90,
            "g1 at step 10",
        )
        groups["g1"].kill()
        assert groups["g1"].popen.returncode == -signal.SIGKILL
        restarted_at = time.time()
        groups["g1"] = start_group_on(hosts["c"], hosts["a"], "g1", tmp_path)
        heal = wait_for_event(
            tmp_path,
            lambda e: e["event"] == "heal_end" and e["replica_id"] == "g1" and e["ts"] > restarted_at,
            90,
            "g1 heal",
        )
        assert heal["ok"], heal
        assert heal["num_bytes"] > 0 and heal["bytes_by_donor"], heal
        for rid, g in groups.items():
            assert g.wait_exit(120) == 0, f"{rid}\n{g.output_tail()}"
        assert_digests_agree(tmp_path, min_steps=STEPS - 10)
        assert_samples_exactly_once(tmp_path, min_steps=STEPS)
        final = {
            e["replica_id"]: e["digest"]
            for e in read_events(tmp_path)
            if e["event"] == "committed" and e["step"] == STEPS
        }
        assert set(final) == {"g0", "g1"} and len(set(final.values())) == 1, f"digests at step {STEPS}: {final}"
