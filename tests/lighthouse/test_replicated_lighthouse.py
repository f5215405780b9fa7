"""The replicated lighthouse (lighthouse/replicated/server.py) on a real three-node etcd cluster and
three real lighthouse processes, all on loopback (issue 24).

The etcd cluster is started once for the module (chaos/etcd_cluster.py, which installs
Debian's etcd-server with apt-get if it is missing and the machine allows it); each test
gives its lighthouses their own key prefix. Members are tests/support/lighthouse_member.py, given
every lighthouse address. Faults: SIGKILL of the leader; a partition between the leader and
etcd (its etcd endpoints go through chaos/blackhole.py, which is then cut); the death of one
etcd member; the loss of etcd's quorum.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ManagedProcess, spawn_python
from support.member_events import MEMBER_SCRIPT, wait_quorum

from chaos.etcd_cluster import EtcdCluster, EtcdNotAvailable, etcd_binary
from lighthouse.tls.throwaway_ca import make_throwaway_ca

EVENT_TIMEOUT_S = 15.0
LEASE_TTL_S = 1

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdCluster]:
    try:
        etcd_binary()
    except EtcdNotAvailable as e:
        pytest.skip(f"no etcd for the replicated lighthouse: {e}")
    with tempfile.TemporaryDirectory(
        prefix="replicaft-etcd-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None
    ) as d:
        with EtcdCluster(Path(d)) as cluster:
            yield cluster


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Lighthouses:
    """Three lighthouse processes of one replicated set, and the members' view of them."""

    def __init__(self, etcd_endpoints: list[list[str]], prefix: str, env: dict[str, str] | None = None) -> None:
        self.env = env
        """The lighthouses' and members' environment (None: this process's), e.g. with TLS files."""
        self.ports = [free_port() for _ in etcd_endpoints]
        self.processes: list[ManagedProcess | None] = [None] * len(etcd_endpoints)
        self.etcd_endpoints = etcd_endpoints
        self.prefix = prefix

    @property
    def addresses(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def start(self, i: int) -> ManagedProcess:
        port = self.ports[i]
        process = spawn_python(
            "-m",
            "lighthouse",
            "--port",
            str(port),
            "--advertise",
            f"127.0.0.1:{port}",
            "--etcd",
            ",".join(self.etcd_endpoints[i]),
            "--etcd-prefix",
            self.prefix,
            "--lease-ttl",
            str(LEASE_TTL_S),
            "--join-timeout",
            "5",
            name=f"lighthouse-{i}",
            env=self.env,
        )
        process.wait_for_line(
            lambda t: t.startswith("lighthouse serving gRPC at "), EVENT_TIMEOUT_S, what="its gRPC address"
        )
        self.processes[i] = process
        return process

    def wait_leader(self, *, exclude: tuple[int, ...] = (), after: dict[int, int] | None = None) -> tuple[int, float]:
        """(index, wall time from its log) of the lighthouse that logs that it leads."""
        deadline = time.monotonic() + EVENT_TIMEOUT_S
        while time.monotonic() < deadline:
            for i, p in enumerate(self.processes):
                if p is None or i in exclude:
                    continue
                for line in p.lines("stderr")[(after or {}).get(i, 0) :]:
                    if " leads " in line.text and "lighthouse 127.0.0.1:" in line.text:
                        return i, log_time(line.text)
            time.sleep(0.02)
        raise AssertionError("no lighthouse took the lead\n" + "\n".join(p.output_tail() for p in self.processes if p))

    def marks(self) -> dict[int, int]:
        return {i: p.mark("stderr") for i, p in enumerate(self.processes) if p is not None}


def log_time(text: str) -> float:
    """The wall time (seconds) of a lighthouse log line (``%(asctime)s``: ms resolution)."""
    match = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ", text)
    assert match is not None, text
    return time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")) + int(match.group(2)) / 1000


def start_members(lighthouses: Lighthouses, names: list[str], *args: str) -> dict[str, ManagedProcess]:
    members = {
        n: spawn_python(MEMBER_SCRIPT, lighthouses.addresses, n, *args, name=f"member-{n}", env=lighthouses.env)
        for n in names
    }
    for m in members.values():
        wait_quorum(m, sorted(names), timeout_s=EVENT_TIMEOUT_S)
    return members


def quorums_after(member: ManagedProcess, mark: int) -> list[dict[str, Any]]:
    return [o for o in member.json_lines(after=mark) if o["event"] == "quorum"]


def test_one_leads_and_members_reach_it_through_any_address(etcd: EtcdCluster) -> None:
    lighthouses = Lighthouses([etcd.endpoints] * 3, "/test/lead")
    for i in range(3):
        lighthouses.start(i)
    leader, _ = lighthouses.wait_leader()
    members = start_members(lighthouses, ["a", "b"])
    # Only the leader formed quorums; the followers logged none.
    for i, p in enumerate(lighthouses.processes):
        assert p is not None
        formed = [line for line in p.lines("stderr") if "quorum" in line.text and "formed with" in line.text]
        assert bool(formed) is (i == leader), (i, leader, p.output_tail())
    assert all(quorums_after(m, 0) for m in members.values())


def test_sigkilled_leader_replaced_and_members_resume_with_no_quorum_id_reused(etcd: EtcdCluster) -> None:
    lighthouses = Lighthouses([etcd.endpoints] * 3, "/test/kill")
    for i in range(3):
        lighthouses.start(i)
    leader, _ = lighthouses.wait_leader()
    members = start_members(lighthouses, ["a", "b"])
    marks = {n: m.mark() for n, m in members.items()}
    before = max(int(q["quorum_id"]) for q in quorums_after(members["a"], 0))
    stderr_marks = lighthouses.marks()

    killed_at = time.monotonic()
    victim = lighthouses.processes[leader]
    assert victim is not None
    victim.kill()
    new_leader, _ = lighthouses.wait_leader(exclude=(leader,), after=stderr_marks)
    resumed = {n: wait_quorum(m, ["a", "b"], after=marks[n], timeout_s=EVENT_TIMEOUT_S) for n, m in members.items()}
    # Taken over through the probe (the dead leader's port refuses), not by waiting out the lease.
    assert any(
        "is gone (connection refused): revoking its lease" in line.text
        for p in lighthouses.processes
        if p is not None
        for line in p.lines("stderr")
    ), "no revoke"
    assert max(read_at for read_at, _ in resumed.values()) - killed_at < 3.0
    for _, quorum in resumed.values():
        assert quorum["quorum_id"] > before, (quorum, before)
    assert new_leader != leader


def test_sigstopped_leader_is_left_within_its_lease_issue_37(etcd: EtcdCluster) -> None:
    """A frozen leader keeps its members' sessions open (the kernel still acknowledges their
    bytes): they waited out their 30 s quorum requests. Now they leave it when the lease it last
    announced runs out, and reach the follower that took the lead within a few leases."""
    quorum_timeout_s = 30.0
    lighthouses = Lighthouses([etcd.endpoints] * 3, "/test/sigstop")
    for i in range(3):
        lighthouses.start(i)
    leader, _ = lighthouses.wait_leader()
    members = start_members(lighthouses, ["a", "b"], "--quorum-timeout-s", f"{quorum_timeout_s:g}")
    marks = {n: m.mark() for n, m in members.items()}
    stderr_marks = {n: m.mark("stderr") for n, m in members.items()}
    lighthouse_marks = lighthouses.marks()
    victim = lighthouses.processes[leader]
    assert victim is not None
    stopped_at = time.monotonic()
    victim.send_signal(signal.SIGSTOP)
    try:
        lighthouses.wait_leader(exclude=(leader,), after=lighthouse_marks)
        resumed = [wait_quorum(m, ["a", "b"], after=marks[n], timeout_s=EVENT_TIMEOUT_S) for n, m in members.items()]
        assert max(read_at for read_at, _ in resumed) - stopped_at < quorum_timeout_s / 3
        for n, m in members.items():
            m.wait_for_line(
                lambda t: "leaves the leader" in t, EVENT_TIMEOUT_S, stream="stderr", after=stderr_marks[n], what="it"
            )
    finally:
        victim.send_signal(signal.SIGCONT)
        victim.kill()


def test_partitioned_leader_stops_serving_before_another_leads(etcd: EtcdCluster, tmp_path: Path) -> None:
    relay_ports = [free_port() for _ in etcd.endpoints]
    relay_args = [a for port, e in zip(relay_ports, etcd.endpoints, strict=True) for a in (str(port), e)]
    relay = spawn_python("-m", "chaos.blackhole", *relay_args, name="blackhole")
    relay.wait_for_line(lambda t: t == "ready", EVENT_TIMEOUT_S, what="ready")
    through_relay = [f"127.0.0.1:{p}" for p in relay_ports]
    lighthouses = Lighthouses([through_relay, etcd.endpoints, etcd.endpoints], "/test/partition")
    lighthouses.start(0)
    assert lighthouses.wait_leader()[0] == 0
    lighthouses.start(1)
    lighthouses.start(2)
    members = start_members(lighthouses, ["a", "b"])
    marks = {n: m.mark() for n, m in members.items()}
    stderr_marks = lighthouses.marks()

    relay.send_signal(signal.SIGUSR1)  # lighthouse 0 still runs, and holds its members' sessions
    new_leader, led_at = lighthouses.wait_leader(exclude=(0,), after=stderr_marks)
    old = lighthouses.processes[0]
    assert old is not None
    stopped = old.wait_for_line(
        lambda t: "stops leading" in t or "stops serving" in t,
        EVENT_TIMEOUT_S,
        stream="stderr",
        after=stderr_marks[0],
        what="that it stopped leading",
    )
    assert log_time(stopped.text) < led_at, (stopped.text, led_at)
    for n, m in members.items():
        wait_quorum(m, ["a", "b"], after=marks[n], timeout_s=EVENT_TIMEOUT_S)
    assert new_leader in (1, 2)


def test_etcd_member_killed_the_leader_keeps_leading(etcd: EtcdCluster) -> None:
    lighthouses = Lighthouses([etcd.endpoints] * 3, "/test/etcd-member")
    for i in range(3):
        lighthouses.start(i)
    leader, _ = lighthouses.wait_leader()
    members = start_members(lighthouses, ["a", "b"])
    stderr_marks = lighthouses.marks()
    # A follower: killing etcd's raft leader stalls every lease renewal for an election, which
    # this test's 1 s lease does not always outlast (the leader then steps down and leads again
    # at once: seen once in ~13 runs); chaos's kill_etcd_member covers any member.
    killed = etcd.follower_index()
    etcd.kill_member(killed)
    try:
        for m in members.values():
            mark = m.mark()
            for _ in range(10):  # ten more quorums, with one etcd member gone
                _, q = wait_quorum(m, ["a", "b"], after=mark, timeout_s=EVENT_TIMEOUT_S)
                mark = m.mark()
        p = lighthouses.processes[leader]
        assert p is not None
        assert not any("stops leading" in line.text for line in p.lines("stderr")[stderr_marks[leader] :])
    finally:
        etcd.restart_member(killed)
        etcd.wait_healthy(EVENT_TIMEOUT_S)


def test_etcd_quorum_lost_stops_quorums_says_so_and_resumes_when_back(etcd: EtcdCluster) -> None:
    lighthouses = Lighthouses([etcd.endpoints] * 3, "/test/etcd-quorum")
    for i in range(3):
        lighthouses.start(i)
    leader, _ = lighthouses.wait_leader()
    members = start_members(lighthouses, ["a", "b"])
    before = max(int(q["quorum_id"]) for q in quorums_after(members["a"], 0))
    stderr_marks = lighthouses.marks()
    etcd.kill_member(1)
    etcd.kill_member(2)
    try:
        p = lighthouses.processes[leader]
        assert p is not None
        p.wait_for_line(
            lambda t: "cannot reach etcd's quorum; not forming quorums" in t,
            EVENT_TIMEOUT_S,
            stream="stderr",
            after=stderr_marks[leader],
            what="that etcd's quorum is gone",
        )
        mark = members["a"].mark()
        time.sleep(1.0)  # the fault's duration, not a synchronisation: no quorum may form meanwhile
        assert quorums_after(members["a"], mark) == []
    finally:
        etcd.restart_member(1)
        etcd.restart_member(2)
    etcd.wait_healthy(EVENT_TIMEOUT_S)
    resumed = [wait_quorum(m, ["a", "b"], after=m.mark(), timeout_s=EVENT_TIMEOUT_S)[1] for m in members.values()]
    assert all(q["quorum_id"] > before for q in resumed)


def test_replicated_lighthouse_over_tls_hands_over_its_members(etcd: EtcdCluster, tmp_path: Path) -> None:
    """Every lighthouse of the set serves over TLS (the job's REPLICAFT_TLS_* files) and its
    members follow the lead to the next one when the leader is killed (issue 19)."""
    files = make_throwaway_ca(tmp_path)
    env = {**os.environ, "REPLICAFT_TLS_CERT": files.cert, "REPLICAFT_TLS_KEY": files.key, "REPLICAFT_TLS_CA": files.ca}
    lighthouses = Lighthouses([etcd.endpoints] * 2, "/test/tls", env)
    for i in range(2):
        lighthouses.start(i)
    leader, _ = lighthouses.wait_leader()
    members = start_members(lighthouses, ["a", "b"])
    marks = {n: m.mark() for n, m in members.items()}
    stderr_marks = lighthouses.marks()
    victim = lighthouses.processes[leader]
    assert victim is not None
    victim.kill()
    lighthouses.wait_leader(exclude=(leader,), after=stderr_marks)
    for n, m in members.items():
        wait_quorum(m, ["a", "b"], after=marks[n], timeout_s=EVENT_TIMEOUT_S)
