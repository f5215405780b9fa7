"""The replicated lighthouse of a chaos run: three lighthouses on a three-node etcd, and the
faults that only it has.

A scenario with ``lighthouse_replicas = 3`` gets, instead of the single lighthouse, an etcd
cluster on loopback (chaos/etcd_cluster.py), one chaos/blackhole.py relay per lighthouse
between it and etcd, and three ``replicaft-lighthouse --etcd`` processes; the groups are
given all three addresses. The runner delegates to this class what it does for the single
lighthouse (start, restart what died after ``restart_delay_s``, stop), and the injector's
lighthouse faults:

* ``kill_lighthouse_leader``: SIGKILL the lighthouse that leads (its own log says so);
  restarted later as a follower;
* ``partition_lighthouse_leader``: cut the leader's relay for ``duration_s``: its etcd
  traffic vanishes while it runs and holds its members' sessions; its lease lapses, and it
  must stop serving before another leads;
* ``kill_etcd_member``: SIGKILL one etcd member (not etcd's leader in particular) for
  ``duration_s``, then restart it on its data;
* ``lose_etcd_quorum``: SIGKILL two of the three etcd members for ``duration_s``: no
  lighthouse may form a quorum meanwhile; training waits and resumes when they are back.
"""

from __future__ import annotations

import logging
import re
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from chaos.etcd_cluster import EtcdCluster
from chaos.processes import Child
from lighthouse.server.announce import GRPC_LINE

logger = logging.getLogger(__name__)

REPLICAS = 3
START_TIMEOUT_S = 30.0
LEASE_TTL_S = 1
_LEADS = re.compile(r"^(\S+ \S+) WARNING lighthouse\.replicated: lighthouse \S+ leads", re.MULTILINE)
_STOPS = re.compile(r"^(\S+ \S+) WARNING lighthouse\.replicated: lighthouse \S+ stops leading", re.MULTILINE)
KINDS = frozenset({"kill_lighthouse_leader", "partition_lighthouse_leader", "kill_etcd_member", "lose_etcd_quorum"})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(slots=True)
class _Later:
    at: float
    action: Callable[[], None]
    what: str


class LighthouseSet:
    """Build with the run's directories and the lighthouse command's extra flags; ``start()``."""

    def __init__(
        self,
        logs_dir: Path,
        data_dir: Path,
        env: dict[str, str],
        cwd: Path,
        extra_args: list[str],
        restart_delay_s: float,
    ) -> None:
        self.logs_dir = logs_dir
        self.etcd = EtcdCluster(data_dir)
        self._env, self._cwd, self._extra = env, cwd, extra_args
        self.restart_delay_s = restart_delay_s
        self.ports = [_free_port() for _ in range(REPLICAS)]
        self.relay_ports = [[_free_port() for _ in self.etcd.members] for _ in range(REPLICAS)]
        self.lighthouses: list[Child | None] = [None] * REPLICAS
        self.relays: list[Child] = []
        self._incarnations = [0] * REPLICAS
        self._restart_at: dict[int, float] = {}
        self._later: list[_Later] = []

    @property
    def address(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def start(self) -> str:
        self.etcd.start()
        for i, ports in enumerate(self.relay_ports):
            args = ["-m", "chaos.blackhole"] + [
                a for p, e in zip(ports, self.etcd.endpoints, strict=True) for a in (str(p), e)
            ]
            relay = Child(
                f"relay#{i}",
                [sys.executable, *args],
                log_path=self.logs_dir / f"relay-{i}.log",
                env=self._env,
                cwd=self._cwd,
            ).start()
            relay.wait_for_output(re.compile(r"^ready$", re.MULTILINE), START_TIMEOUT_S)
            self.relays.append(relay)
        for i in range(REPLICAS):
            self._start_lighthouse(i)
        return self.address

    def _start_lighthouse(self, i: int) -> None:
        self._incarnations[i] += 1
        args = [
            sys.executable,
            "-m",
            "lighthouse",
            "--port",
            str(self.ports[i]),
            "--advertise",
            f"127.0.0.1:{self.ports[i]}",
            "--lease-ttl",
            str(LEASE_TTL_S),
            "--etcd",
            ",".join(f"127.0.0.1:{p}" for p in self.relay_ports[i]),
            *self._extra,
        ]
        child = Child(
            f"lighthouse{i}#{self._incarnations[i]}",
            args,
            log_path=self.logs_dir / f"lighthouse{i}-{self._incarnations[i]}.log",
            env=self._env,
            cwd=self._cwd,
        ).start()
        child.wait_for_output(GRPC_LINE, START_TIMEOUT_S)
        self.lighthouses[i] = child

    def leader(self) -> int | None:
        """The lighthouse whose log last says it leads (and has not said since that it stopped)."""
        best: tuple[str, int] | None = None
        for i, child in enumerate(self.lighthouses):
            if child is None or child.poll() is not None:
                continue
            text = child.log_path.read_text(errors="replace")
            leads, stops = _LEADS.findall(text), _STOPS.findall(text)
            if leads and (not stops or leads[-1] > stops[-1]) and (best is None or leads[-1] > best[0]):
                best = (leads[-1], i)
        return None if best is None else best[1]

    def tick(self, now: float, *, restarting: bool) -> None:
        """Restart dead lighthouses ``restart_delay_s`` after they died; undo timed faults."""
        for later in [x for x in self._later if now >= x.at]:
            self._later.remove(later)
            logger.info("undoing: %s", later.what)
            later.action()
        for i, child in enumerate(self.lighthouses):
            if child is not None and child.poll() is not None and i not in self._restart_at and restarting:
                self._restart_at[i] = now + self.restart_delay_s
        for i, at in list(self._restart_at.items()):
            if now >= at:
                del self._restart_at[i]
                self._start_lighthouse(i)

    def fault(self, kind: str, duration_s: float) -> str | None:
        """Inject one of :data:`KINDS`; returns why it cannot be injected now, or None."""
        now = time.monotonic()
        if kind in ("kill_lighthouse_leader", "partition_lighthouse_leader"):
            leader = self.leader()
            if leader is None:
                return "no lighthouse leads right now"
            if kind == "kill_lighthouse_leader":
                child = self.lighthouses[leader]
                assert child is not None
                child.kill()
                return None
            relay = self.relays[leader]
            relay.signal(signal.SIGUSR1)
            self._later.append(
                _Later(
                    now + duration_s, lambda: relay.signal(signal.SIGUSR2), f"heal lighthouse {leader}'s link to etcd"
                )
            )
            return None
        down = [i for i, m in enumerate(self.etcd.members) if not m.alive]
        if down:
            return f"etcd members {down} are still down from an earlier fault"
        victims = [0] if kind == "kill_etcd_member" else [1, 2]
        for v in victims:
            self.etcd.kill_member(v)
        self._later.append(
            _Later(now + duration_s, lambda: self._restart_etcd(victims), f"restart etcd members {victims}")
        )
        return None

    def _restart_etcd(self, members: list[int]) -> None:
        for m in members:
            self.etcd.restart_member(m)

    def stop(self) -> None:
        for child in [*self.lighthouses, *self.relays]:
            if child is not None:
                child.kill()
        self.etcd.stop()
