"""Replicated lighthouse: what every group loses when the leader dies or is cut off, beside
the single lighthouse's restart, and a soak of leader kills checked for forks.

What runs. A three-node etcd cluster on loopback (chaos/etcd_cluster.py, data on tmpfs),
three ``replicaft-lighthouse --etcd ...`` processes, and three replica groups (one process
each, W = 1, benchmarks/failover_worker.py: a ~1 MB model with an 80 ms pacing sleep per
step) given all three lighthouse addresses. Each lighthouse reaches etcd through its own
chaos/blackhole.py relay, so any of them can be cut off from etcd while it keeps running.

Faults, one at a time, each once every group has committed a few steps since the last:

* ``leader_kill``: SIGKILL of the leading lighthouse (found from its log line), restarted
  afterwards as a follower, as an orchestrator would;
* ``leader_partition``: the leader's relay is cut (SIGUSR1): its etcd traffic vanishes, its
  members' sessions stay open; it must stop serving on its own lease clock before another
  lighthouse leads (target: within the lease + 0.5 s). The relay is healed afterwards.
* baseline, the same run: the single lighthouse (no etcd) SIGKILLed and restarted at once on
  its port, as the demo's supervisor does. It forms its first quorum once every member of the
  last quorum is back and asking (lighthouse/rules/reconnects.py): 0.37 s lost, where waiting
  one join timeout for them first lost 2.37 s.

Time lost by a group, as in failover.py: ``(its K-th commit after the fault - its last commit
before) - K * T``, T its median commit interval before, K = 3; all three groups survive
every fault here, so each fault gives three samples. For a partition K also covers the lease
plus a second of steady steps: the cut-off leader serves on until its lease clock runs out,
and the loss comes only then.

The soak: ``SOAK_KILLS`` leader kills in a row on the same job (each killed lighthouse
restarted before the next kill), then the managers' event logs (state digest after every
committed step) are checked with chaos/invariants.py: identical digests for every step across
groups (no step committed in two histories) and committed steps monotonic and never lost.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.failover import Worker, median_interval, until
from benchmarks.processes import Child, ChildFailed, ChildProcesses
from benchmarks.results import BenchmarkResult
from chaos.etcd_cluster import EtcdCluster
from chaos.invariants import check_identical_digests, check_monotonic_steps
from replicaft.telemetry.events import read_events_dir

GROUPS = 3
STEP_SLEEP_S = 0.08
AFTER_COMMITS = 3
LEASE_TTL_S = 2
SOAK_KILLS = 100
START_TIMEOUT_S = 180.0
FAULT_TIMEOUT_S = 60.0
SETTLE_COMMITS = 5
"""Commits every group makes between two faults (and before the first)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Job:
    """The lighthouse(s), their relays and the groups of one measured job."""

    def __init__(self, children: ChildProcesses, events_dir: Path, etcd: EtcdCluster | None) -> None:
        self.children = children
        self.events_dir = events_dir
        self.etcd = etcd
        n = 3 if etcd is not None else 1
        self.ports = [_free_port() for _ in range(n)]
        self.relay_ports = [[_free_port() for _ in range(3)] for _ in range(n)] if etcd is not None else []
        self.lighthouses: list[Child | None] = [None] * n
        self.relays: list[Child] = []
        self.incarnations = [0] * n
        self.workers: list[Worker] = []
        self.changed = asyncio.Event()
        self.readers: list[asyncio.Task[None]] = []

    @property
    def addresses(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    async def start(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        if self.etcd is not None:
            for i, ports in enumerate(self.relay_ports):
                args = [a for port, e in zip(ports, self.etcd.endpoints, strict=True) for a in (str(port), e)]
                relay = await self.children.start_python(f"relay{i}", "-m", "chaos.blackhole", *args)
                await relay.expect_line("ready", deadline)
                self.relays.append(relay)
        for i in range(len(self.ports)):
            await self.start_lighthouse(i, deadline)
        for g in range(GROUPS):
            child = await self.children.start_python(
                f"g{g}",
                "-m",
                "benchmarks.failover_worker",
                "--impl",
                "replicaft",
                "--lighthouse",
                self.addresses,
                "--replica-id",
                f"g{g}",
                "--step-sleep",
                str(STEP_SLEEP_S),
                "--events-dir",
                str(self.events_dir),
                "--digest-every-steps",
                "1",
            )
            self.workers.append(Worker(f"g{g}", child))
        self.readers = [asyncio.create_task(w.read(time.monotonic() + 7200, self.changed)) for w in self.workers]
        if not await until(self.changed, deadline, lambda: all(w.full_commits() >= 10 for w in self.workers)):
            raise ChildFailed(
                "groups did not reach 10 full-quorum commits: "
                + "".join(w.child.stderr_tail()[-600:] for w in self.workers)
            )

    async def start_lighthouse(self, i: int, deadline: float) -> None:
        self.incarnations[i] += 1
        args = ["-m", "lighthouse", "--port", str(self.ports[i]), "--log-level", "WARNING"]
        if self.etcd is not None:
            args += [
                "--advertise",
                f"127.0.0.1:{self.ports[i]}",
                "--lease-ttl",
                str(LEASE_TTL_S),
                "--etcd",
                ",".join(f"127.0.0.1:{p}" for p in self.relay_ports[i]),
            ]
        child = await self.children.start_python(f"lh{i}-{self.incarnations[i]}", *args)
        await child.expect_line("lighthouse serving gRPC at ", deadline)
        self.lighthouses[i] = child

    def leader(self) -> int:
        """The lighthouse whose last leadership line is the latest (replicated set only)."""
        best, best_at = -1, ""
        for i, child in enumerate(self.lighthouses):
            if child is None or child.returncode is not None:
                continue
            text = child.stderr_text()
            leads = [line for line in text.splitlines() if " leads " in line]
            stops = [line for line in text.splitlines() if "stops leading" in line]
            if leads and (not stops or leads[-1][:23] > stops[-1][:23]) and leads[-1][:23] > best_at:
                best, best_at = i, leads[-1][:23]
        return best

    async def settle(self) -> None:
        counts = [len(w.commits()) for w in self.workers]
        ok = await until(
            self.changed,
            time.monotonic() + FAULT_TIMEOUT_S,
            lambda: all(len(w.commits()) >= c + SETTLE_COMMITS for w, c in zip(self.workers, counts, strict=True)),
        )
        if not ok:
            raise ChildFailed(
                "groups stopped committing between faults: "
                + "".join(w.child.stderr_tail()[-600:] for w in self.workers)
            )

    async def measure(self, fault: Any, *, after_s: float = 0.0) -> dict[str, Any]:
        """Apply ``fault()`` and return each group's loss over the first K commits after it,
        K = AFTER_COMMITS plus the commits a steady group makes in ``after_s``: a partitioned
        leader serves on until its lease clock runs out, so its window must reach past that."""
        await self.settle()
        t_steady = statistics.median(median_interval(w.commits()[-20:]) for w in self.workers)
        k = AFTER_COMMITS + int(after_s / t_steady)
        await fault()
        t_fault = time.time()
        ok = await until(
            self.changed,
            time.monotonic() + FAULT_TIMEOUT_S,
            lambda: all(sum(1 for c in w.commits() if c["ts"] > t_fault) >= k for w in self.workers),
        )
        record: dict[str, Any] = {"groups": {}, "k": k}
        for w in self.workers:
            before = [c for c in w.commits() if c["ts"] <= t_fault]
            after = [c for c in w.commits() if c["ts"] > t_fault]
            t_steady = median_interval(before[-20:])
            if not ok or len(after) < k:
                record["groups"][w.name] = {"crashed": True, "why": w.ended or f"{len(after)} commits"}
                continue
            lost = after[k - 1]["ts"] - before[-1]["ts"] - k * t_steady
            record["groups"][w.name] = {"lost_s": round(lost, 4), "t_steady_s": round(t_steady, 4)}
        return record

    async def close(self) -> None:
        for r in self.readers:
            r.cancel()
        await asyncio.gather(*self.readers, return_exceptions=True)


def _losses(records: list[dict[str, Any]]) -> list[float]:
    return [g["lost_s"] for r in records for g in r["groups"].values() if "lost_s" in g]


def _crashes(records: list[dict[str, Any]]) -> int:
    return sum(1 for r in records for g in r["groups"].values() if g.get("crashed"))


async def _single(repeats: int) -> list[dict[str, Any]]:
    records = []
    with tempfile.TemporaryDirectory(prefix="replicaft-ha-single-") as events:
        async with ChildProcesses() as children:
            job = Job(children, Path(events), None)
            await job.start()
            try:
                for _ in range(repeats):

                    async def restart() -> None:
                        child = job.lighthouses[0]
                        assert child is not None
                        child.kill()
                        await child.wait(time.monotonic() + 10)
                        await job.start_lighthouse(0, time.monotonic() + 30)

                    records.append(await job.measure(restart))
                    print(f"lighthouse_ha single restart: {records[-1]['groups']}", flush=True)
            finally:
                await job.close()
    return records


async def _replicated(repeats: int, soak_kills: int, root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"kill": [], "partition": [], "soak": []}
    with EtcdCluster(root / "etcd") as etcd, tempfile.TemporaryDirectory(prefix="replicaft-ha-") as events:
        async with ChildProcesses() as children:
            job = Job(children, Path(events), etcd)
            await job.start()

            async def kill_leader(record_in: list[dict[str, Any]], label: str) -> None:
                leader = job.leader()
                victim = job.lighthouses[leader]
                assert victim is not None, "no leader"

                async def fault() -> None:
                    victim.kill()

                record = await job.measure(fault)
                record["leader"] = leader
                record_in.append(record)
                await victim.wait(time.monotonic() + 10)
                await job.start_lighthouse(leader, time.monotonic() + 30)
                print(f"lighthouse_ha {label}: killed lighthouse {leader}: {record['groups']}", flush=True)

            try:
                for _ in range(repeats):
                    await kill_leader(out["kill"], "leader kill")
                for _ in range(repeats):
                    leader = job.leader()
                    relay = job.relays[leader]

                    async def cut(relay: Child = relay) -> None:
                        relay.send_signal(signal.SIGUSR1)

                    record = await job.measure(cut, after_s=LEASE_TTL_S + 1.0)
                    record["leader"] = leader
                    out["partition"].append(record)
                    relay.send_signal(signal.SIGUSR2)
                    print(
                        f"lighthouse_ha leader partition: cut lighthouse {leader} off etcd: {record['groups']}",
                        flush=True,
                    )
                for _ in range(soak_kills):
                    await kill_leader(out["soak"], "soak")
                await job.settle()
            finally:
                await job.close()
            events_list = read_events_dir(Path(events))
            out["digests"] = check_identical_digests(events_list)
            out["monotonic"] = check_monotonic_steps(events_list)
            out["committed_steps"] = sum(1 for e in events_list if e["event"] == "commit" and e.get("committed"))
    return out


def run(*, quick: bool) -> BenchmarkResult:
    repeats = 2 if quick else 5
    soak_kills = 5 if quick else SOAK_KILLS
    single = asyncio.run(_single(repeats))
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="replicaft-ha-etcd-", dir=shm) as root:
        ha = asyncio.run(_replicated(repeats, soak_kills, Path(root)))
    single_lost = statistics.median(_losses(single))
    kill = _losses(ha["kill"])
    partition = _losses(ha["partition"])
    soak = _losses(ha["soak"])
    violations = len(ha["digests"].violations) + len(ha["monotonic"].violations)
    if ha["digests"].status == "not_checked" or ha["monotonic"].status == "not_checked":
        raise RuntimeError(f"the soak's invariants could not be checked: {ha['digests'].note}; {ha['monotonic'].note}")
    figures = {
        "leader_kill_lost_s": statistics.median(kill),
        "leader_kill_lost_s_max": max(kill),
        "leader_partition_lost_s": statistics.median(partition),
        "leader_partition_lost_s_max": max(partition),
        "soak_leader_kills": float(len(ha["soak"])),
        "soak_lost_s_p50": statistics.median(soak),
        "soak_lost_s_max": max(soak),
        "soak_group_crashes": float(_crashes(ha["soak"])),
        "soak_invariant_violations": float(violations),
        "soak_committed_steps": float(ha["committed_steps"]),
    }
    baselines = {"single_lighthouse_restart_lost_s": single_lost}
    return BenchmarkResult(
        name="lighthouse_ha",
        figures=figures,
        baselines=baselines,
        compared_to={
            "leader_kill_lost_s": "single_lighthouse_restart_lost_s",
            "leader_partition_lost_s": "single_lighthouse_restart_lost_s",
        },
        notes=(
            f"seconds each of {GROUPS} groups (W=1, ~1 MB model, {STEP_SLEEP_S * 1000:.0f} ms pacing sleep) loses "
            f"when the leading lighthouse of 3 (etcd lease {LEASE_TTL_S} s, 3-node etcd on loopback) is SIGKILLed "
            f"(target 0.5 s) or cut off from etcd while it runs (target lease + 0.5 s = {LEASE_TTL_S + 0.5:g} s), "
            f"beside the single lighthouse SIGKILLed and restarted at once in the same run; (K-th commit after - "
            f"last before) - K*T, K={AFTER_COMMITS}, median over 3 groups x {repeats} faults; soak: "
            f"{len(ha['soak'])} leader kills in a row, then identical state digests per step across groups and "
            f"monotonic, never-lost commits checked over {ha['committed_steps']} committed steps "
            f"(soak_invariant_violations: {violations})"
        ),
        params={
            "quick": quick,
            "repeats": repeats,
            "lease_ttl_s": LEASE_TTL_S,
            "groups": GROUPS,
            "single": single,
            "kill": ha["kill"],
            "partition": ha["partition"],
            "soak": ha["soak"],
            "digest_verdict": {
                "status": ha["digests"].status,
                "note": ha["digests"].note,
                "violations": [str(v) for v in ha["digests"].violations][:20],
            },
            "monotonic_verdict": {
                "status": ha["monotonic"].status,
                "note": ha["monotonic"].note,
                "violations": [str(v) for v in ha["monotonic"].violations][:20],
            },
        },
    )
