"""The Slurm recipes of ``deploy/slurm/``, as shipped, on a real Slurm cluster on this machine
(issue 39): Debian's munged, slurmctld and three slurmd (nodes 127.0.0.2-4, chaos/slurm_cluster.py),
one cluster for the module; the jobs are submitted with ``deploy/slurm/submit.sh`` from the
repository root, as its README says, and set up only through the recipes' own variables.

What the recipes are told here and why: ``GROUPS_SBATCH_ARGS="--cpus-per-task=1 --gpus-per-node=0"``
(replicaft.sbatch asks 32 CPUs and 8 GPUs per group; this cluster has no GPU); free ports for
the lighthouse (``LIGHTHOUSE_PORT``, ``LIGHTHOUSE_STATUS_PORT``, and etcd's for the replicated
one) since other jobs share the machine; ``LIGHTHOUSE_ARGS="--hung-min 2"``: on a machine this
loaded a group stalls for more than the default quarter second and would be fenced as hung now
and then. Slurm's requeue wait (``AuthInfo=cred_expire``) is 5 s here, not its default 120 s
(benchmarks/slurm_restart.py measures the default).
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT
from support.training_events import (
    assert_digests_agree,
    assert_samples_exactly_once,
    read_events,
    wait_for_event,
)

from chaos.etcd_cluster import EtcdNotAvailable, etcd_binary
from chaos.slurm_cluster import SlurmCluster, SlurmNotAvailable
from replicaft.launch.children import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

STEPS = 500
STEP_DELAY_S = "0.1"
"""500 steps of at least 0.1 s: the survivors are still training when the restarted groups come
back (a requeue waits 5 s, then the group starts torchrun, 3-20 s here depending on the load,
and heals)."""
START_TIMEOUT_S = 120.0
RECOVERY_TIMEOUT_S = 120.0
END_TIMEOUT_S = 180.0
MAX_SURVIVOR_GAP_S = 5.0


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    try:
        cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=3, cred_expire_s=5)
    except SlurmNotAvailable as e:
        pytest.skip(str(e))
    with cluster:
        yield cluster


@pytest.fixture(autouse=True)
def cancel_jobs(slurm: SlurmCluster) -> Iterator[None]:
    """Whatever a test leaves in the queue (it failed half-way) is cancelled before the next."""
    yield
    slurm.cancel_all()


@dataclass(frozen=True)
class Job:
    """A submitted replicaft job: its two Slurm jobs, where it logs, where its events go."""

    slurm: SlurmCluster
    lighthouse_job: str
    groups_job: str
    run_dir: Path
    events: Path

    def task(self, i: int) -> str:
        return f"{self.groups_job}_{i}"

    def show(self, job: str) -> dict[str, str]:
        """``scontrol show job``'s fields of ``job`` (an array task: ``<job>_<i>``)."""
        out = self.slurm.run(["scontrol", "show", "job", "-o", job]).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def log(self, i: int) -> str:
        return (self.run_dir / f"replicaft-{self.groups_job}_g{i}.out").read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.run_dir.glob("*.out"))
        )


def submit(slurm: SlurmCluster, tmp_path: Path, **variables: str) -> Job:
    run_dir, events = tmp_path / "run", tmp_path / "events"
    env = slurm.env()
    env.update(
        RUN_DIR=str(run_dir),
        REPLICAFT_EVENTS_DIR=str(events),
        REPLICAFT_TOKEN=secrets.token_urlsafe(32),
        LIGHTHOUSE_PORT=str(free_port()),
        LIGHTHOUSE_STATUS_PORT=str(free_port()),
        LIGHTHOUSE_ARGS="--hung-min 2",
        GROUPS_SBATCH_ARGS="--cpus-per-task=1 --gpus-per-node=0",
        **variables,
    )
    result = subprocess.run(
        [
            "deploy/slurm/submit.sh",
            "--groups",
            "3",
            "examples/train_ddp.py",
            "--steps",
            str(STEPS),
            "--step-delay",
            STEP_DELAY_S,
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    match = re.search(r"lighthouse job (\d+), replica groups job (\d+)", result.stdout)
    assert match, result.stdout
    return Job(slurm, match.group(1), match.group(2), run_dir, events)


def _committed(replica_id: str, min_step: int = 0, after_ts: float = 0.0) -> Callable[[dict[str, Any]], bool]:
    return lambda e: (
        e["event"] == "committed" and e["replica_id"] == replica_id and e["step"] >= min_step and e["ts"] > after_ts
    )


def wait_event(job: Job, predicate: Callable[[dict[str, Any]], bool], timeout_s: float, what: str) -> dict[str, Any]:
    try:
        return wait_for_event(job.events, predicate, timeout_s, what)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{job.logs()}") from None


def wait_healed(job: Job, replica_id: str, since: float) -> dict[str, Any]:
    """``replica_id`` started again after ``since``, healed from its peers and committed the next step."""
    wait_event(
        job,
        lambda e: e["event"] == "start" and e["replica_id"] == replica_id and e["ts"] > since,
        RECOVERY_TIMEOUT_S,
        f"{replica_id} started again",
    )
    heal = wait_event(
        job,
        lambda e: e["event"] == "heal_end" and e["replica_id"] == replica_id and e["ts"] > since,
        RECOVERY_TIMEOUT_S,
        f"{replica_id} healed",
    )
    assert heal["ok"] and heal["bytes_by_donor"], heal
    wait_event(
        job,
        _committed(replica_id, heal["step"] + 1, since),
        RECOVERY_TIMEOUT_S,
        f"{replica_id} committed after its heal",
    )
    return heal


def assert_never_stopped(events: Path, replica_id: str, start: float, end: float) -> None:
    everything = read_events(events)
    starts = [e for e in everything if e["event"] == "start" and e["replica_id"] == replica_id]
    assert len(starts) == 1, f"{replica_id} was restarted: {starts}"
    times = (
        [start] + sorted(e["ts"] for e in everything if _committed(replica_id, 0, start)(e) and e["ts"] <= end) + [end]
    )
    gap = max(b - a for a, b in zip(times, times[1:], strict=False))
    assert gap < MAX_SURVIVOR_GAP_S, f"{replica_id} stopped committing for {gap:.1f}s"


def wait_all_finished(job: Job) -> None:
    deadline = time.monotonic() + END_TIMEOUT_S
    while job.slurm.run(["squeue", "-h", "-j", job.groups_job], check=False).stdout.strip():
        assert time.monotonic() < deadline, f"the groups did not finish within {END_TIMEOUT_S:g}s\n{job.logs()}"
        time.sleep(0.5)
    states = {i: job.show(job.task(i))["JobState"] for i in range(3)}
    assert states == dict.fromkeys(range(3), "COMPLETED"), f"{states}\n{job.logs()}"


def test_slurm_recipe_restarts_a_killed_group_in_its_step_and_brings_back_a_cancelled_one_by_requeue(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    job = submit(slurm, tmp_path)
    for rid in ("g0", "g1", "g2"):
        wait_event(job, _committed(rid, 3), START_TIMEOUT_S, f"{rid} committed step 3")

    # A rank of g1 SIGKILLed: torchrun takes the group down and run_group.sh starts it again in
    # the same job step. g2's task cancelled (scancel) and requeued (scontrol requeue), as the
    # recipe's README says: Slurm runs the task again, under the same replica id.
    (g1,) = [e for e in read_events(job.events) if e["event"] == "start" and e["replica_id"] == "g1"]
    faults_at = time.time()
    os.kill(g1["pid"], signal.SIGKILL)
    slurm.run(["scancel", job.task(2)])
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while job.show(job.task(2))["JobState"] != "CANCELLED":
        assert time.monotonic() < deadline, job.show(job.task(2))
        time.sleep(0.2)
    slurm.run(["scontrol", "requeue", job.task(2)])

    heals = {rid: wait_healed(job, rid, faults_at) for rid in ("g1", "g2")}
    back = max(e["ts"] for rid in ("g1", "g2") for e in read_events(job.events) if _committed(rid, 0, faults_at)(e))
    assert_never_stopped(job.events, "g0", faults_at, back)
    assert "[run_group] g1: exit 1; restart 1 in 2s" in job.log(1), job.log(1)
    assert job.show(job.task(1))["Restarts"] == "0", "g1 came back inside its job step, not by a requeue"
    assert job.show(job.task(2))["Restarts"] == "1", "g2 came back by Slurm's requeue"

    wait_all_finished(job)
    assert_digests_agree(job.events, min_steps=STEPS)
    assert_samples_exactly_once(job.events, min_steps=STEPS)
    print(
        f"Slurm recipe: {STEPS} steps, equal digests and every sample once; heals "
        + ", ".join(f"{rid} to step {h['step']} in {h['seconds']:.2f}s" for rid, h in heals.items())
    )
    slurm.run(["scancel", job.lighthouse_job])


def _pids_with_args(*args: str) -> list[int]:
    """Processes whose command line holds ``args`` in a row."""
    wanted = [a.encode() for a in args]
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(argv[i : i + len(wanted)] == wanted for i in range(len(argv))):
                found.append(int(entry.name))
    return found


def test_slurm_replicated_lighthouse_recipe_survives_its_leader_killed_and_its_job_cancelled_and_requeued(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    try:
        etcd_binary()
    except EtcdNotAvailable as e:
        pytest.skip(f"no etcd for the replicated lighthouse: {e}")
    job = submit(
        slurm,
        tmp_path,
        LIGHTHOUSE_SBATCH="lighthouse-replicated.sbatch",
        ETCD_CLIENT_PORT=str(free_port()),
        ETCD_PEER_PORT=str(free_port()),
        ETCD_DATA_DIR=str(tmp_path / "etcd"),
    )
    for rid in ("g0", "g1", "g2"):
        wait_event(job, _committed(rid, 3), START_TIMEOUT_S, f"{rid} committed step 3")
    lighthouse_log = job.run_dir / f"replicaft-lighthouse-{job.lighthouse_job}.out"
    addresses = (job.run_dir / f"lighthouse-{job.lighthouse_job}.addr").read_text().strip().split(",")
    assert len(addresses) == 3 and len({a.split(":")[0] for a in addresses}) == 3, addresses

    # The leader's process SIGKILLed: a follower leads within about a lease; the task's loop
    # starts the killed one again; the groups train on.
    (leader,) = re.findall(r"lighthouse (\S+) leads", lighthouse_log.read_text())[-1:]
    (pid,) = _pids_with_args("--advertise", leader)
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while not [a for a in re.findall(r"lighthouse (\S+) leads", lighthouse_log.read_text()) if a != leader]:
        assert time.monotonic() < deadline, lighthouse_log.read_text()[-3000:]
        time.sleep(0.2)
    for rid in ("g0", "g1", "g2"):
        step = max(e["step"] for e in read_events(job.events) if _committed(rid)(e))
        wait_event(
            job, _committed(rid, step + 5, killed_at), RECOVERY_TIMEOUT_S, f"{rid} trained on under a new leader"
        )

    # The whole lighthouse job cancelled, then requeued: the groups keep their addresses and
    # carry on once it is back; nothing they committed is lost.
    slurm.run(["scancel", job.lighthouse_job])
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while job.show(job.lighthouse_job)["JobState"] != "CANCELLED":
        assert time.monotonic() < deadline, job.show(job.lighthouse_job)
        time.sleep(0.2)
    cancelled_at = time.time()
    slurm.run(["scontrol", "requeue", job.lighthouse_job])
    for rid in ("g0", "g1", "g2"):
        step = max(e["step"] for e in read_events(job.events) if _committed(rid)(e))
        wait_event(
            job,
            _committed(rid, step + 5, cancelled_at),
            RECOVERY_TIMEOUT_S,
            f"{rid} trained on with the requeued lighthouse job",
        )
    assert job.show(job.lighthouse_job)["Restarts"] == "1"

    wait_all_finished(job)
    assert_digests_agree(job.events, min_steps=STEPS)
    assert_samples_exactly_once(job.events, min_steps=STEPS)
    starts = [e["replica_id"] for e in read_events(job.events) if e["event"] == "start"]
    print(
        f"Slurm replicated lighthouse: {STEPS} steps, equal digests and every sample once; leader {leader} killed, "
        f"the job cancelled and requeued; group starts: {starts}"
    )
    slurm.run(["scancel", job.lighthouse_job])
