"""``python -m benchmarks slurm_restart``: a replica group's restart under Slurm, with the recipes of
``deploy/slurm/`` as shipped, beside the same restart under ``replicaft-launch``, in one run (issue 39).

Three groups of ``examples/train_ddp.py`` (group_restart.py) submitted with
``deploy/slurm/submit.sh`` to a Slurm cluster on this machine (chaos/slurm_cluster.py). Two ways
back for ``g1``: a SIGKILL of its rank, which ``run_group.sh`` restarts inside the same job step
(``slurm_step_restart``), and ``scontrol requeue`` of its array task, what Slurm does when a node
fails or is preempted (``slurm_requeue``): the task is ended, held, scheduled again and run from
the top. Slurm holds a requeued job for its credential lifetime (``AuthInfo=cred_expire``,
120 s unless a site sets it), which is most of a requeue's cost: ``slurm_requeue`` is measured
on a cluster with that default, ``slurm_requeue_cred5`` on one set to 5 s. ``--quick``: one
restart of each kind and no 120 s cluster; else three, and two requeues at the default.
"""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.group_restart import (
    REPO_ROOT,
    SCRIPT_ARGS,
    Events,
    Restart,
    launcher_restarts,
    measure_restarts,
    sigkill_rank,
    summary,
)
from benchmarks.results import BenchmarkResult, BenchmarkUnavailable
from chaos.slurm_cluster import SlurmCluster, SlurmNotAvailable
from replicaft.launch.children import free_port


def slurm_restarts(root: Path, cred_expire_s: int, kinds: dict[str, int]) -> dict[str, list[Restart]]:
    """Submit the job to a fresh cluster and measure ``kinds`` ({"step": n, "requeue": m}) in turn."""
    cluster = SlurmCluster(root / "slurm", nodes=1, cred_expire_s=cred_expire_s)
    with cluster:
        events = Events(root / "events")
        env = cluster.env() | {
            "RUN_DIR": str(root / "run"),
            "REPLICAFT_EVENTS_DIR": str(events.directory),
            "REPLICAFT_TOKEN": secrets.token_urlsafe(32),
            "LIGHTHOUSE_PORT": str(free_port()),
            "LIGHTHOUSE_STATUS_PORT": str(free_port()),
            "GROUPS_SBATCH_ARGS": "--cpus-per-task=1 --gpus-per-node=0",
            "PYTHON": sys.executable,
            "OMP_NUM_THREADS": "1",
        }
        out = subprocess.run(
            ["deploy/slurm/submit.sh", "--groups", "3", "examples/train_ddp.py", *SCRIPT_ARGS],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        match = re.search(r"replica groups job (\d+)", out.stdout)
        if out.returncode != 0 or not match:
            raise RuntimeError(f"submit.sh failed ({out.returncode}): {out.stderr}{out.stdout}")
        task = f"{match.group(1)}_1"

        def requeue(_: dict[str, Any]) -> None:
            cluster.run(["scontrol", "requeue", task])

        ways: dict[str, Callable[[dict[str, Any]], None]] = {"step": sigkill_rank, "requeue": requeue}
        try:
            return {kind: measure_restarts(events, ways[kind], n) for kind, n in kinds.items()}
        except RuntimeError as e:
            logs = "\n".join(p.read_text(errors="replace")[-1500:] for p in sorted((root / "run").glob("*.out")))
            raise RuntimeError(f"{e}\n{logs}") from None


def run(*, quick: bool) -> BenchmarkResult:
    count = 1 if quick else 3
    try:
        SlurmCluster(Path(tempfile.gettempdir()))  # checks (and installs) Slurm; starts nothing
    except SlurmNotAvailable as e:
        raise BenchmarkUnavailable(str(e)) from None
    with tempfile.TemporaryDirectory(prefix="replicaft-slurm-restart-") as d:
        root = Path(d)
        baseline = launcher_restarts(root, count, sys.executable)
        fast = slurm_restarts(root / "cred5", 5, {"step": count, "requeue": count})
        default = {} if quick else slurm_restarts(root / "cred120", 120, {"requeue": 2})
    figures = summary("slurm_step_restart", fast["step"]) | summary("slurm_requeue_cred5", fast["requeue"])
    if default:
        figures |= summary("slurm_requeue", default["requeue"])
    baselines = summary("launch_restart", baseline)
    compared = {
        f"{prefix}{k}": f"launch_restart{k}"
        for prefix in ("slurm_step_restart", "slurm_requeue_cred5", *(["slurm_requeue"] if default else []))
        for k in ("_s", "_to_start_s")
    }
    return BenchmarkResult(
        name="slurm_restart",
        figures=figures,
        baselines=baselines,
        compared_to=compared,
        notes="Take-down of g1 to its first commit after its heal, median of the restarts; _to_start_s: to the new "
        "process's start event. slurm_step_restart: SIGKILL of g1's rank, run_group.sh restarts it in its job "
        "step (RESTART_DELAY 2 s); slurm_requeue: scontrol requeue of g1's array task with Slurm's default "
        "cred_expire (120 s, which holds a requeued job); slurm_requeue_cred5: the same with cred_expire=5. "
        "Baseline: replicaft-launch --groups 3, g1's rank SIGKILLed. One node, sched_interval=1; same "
        "script and machine, one run.",
        params={
            "restarts": count,
            "script": "examples/train_ddp.py " + " ".join(SCRIPT_ARGS),
            "slurm": "Debian slurm-wlm 22.05, deploy/slurm/submit.sh as shipped",
        },
    )
