"""``python -m benchmarks ray_restart``: a replica group's restart under Ray Train beside the same
restart under ``replicaft-launch``, in one run (issue 39).

Both run three groups of ``examples/train_ddp.py`` (group_restart.py); ``g1``'s process is
SIGKILLed and the figure is kill to its first committed step after it heals. Under Ray it is a
Ray Train worker of ``python -m replicaft.ray`` on a one-node Ray cluster on loopback
(chaos/ray_cluster.py): Ray Train notices the dead worker at its next poll (every 2 s by
default), starts a new worker process at the same world rank and runs the script in it. Under
the launcher, the launcher sees its child exit and starts the group again (an idle standby
takes its place where one is warm). ``--quick``: one restart each (Ray's start alone is about
a minute here), else three.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from benchmarks.group_restart import (
    SCRIPT,
    SCRIPT_ARGS,
    Events,
    launcher_restarts,
    measure_restarts,
    sigkill_rank,
    spawn,
    stop,
    summary,
)
from benchmarks.results import BenchmarkResult, BenchmarkUnavailable
from chaos.ray_cluster import RayCluster, RayNotAvailable


def run(*, quick: bool) -> BenchmarkResult:
    count = 1 if quick else 3
    try:
        cluster = RayCluster()
    except RayNotAvailable as e:
        raise BenchmarkUnavailable(str(e)) from None
    with tempfile.TemporaryDirectory(prefix="replicaft-ray-restart-") as d:
        root = Path(d)
        baseline = launcher_restarts(root, count, sys.executable)
        with cluster:
            events = Events(root / "ray-events")
            env = cluster.driver_env() | {"REPLICAFT_EVENTS_DIR": str(events.directory), "OMP_NUM_THREADS": "1"}
            driver = spawn(
                [
                    sys.executable,
                    "-m",
                    "replicaft.ray",
                    "--groups",
                    "3",
                    "--max-restarts",
                    str(count + 2),
                    "--storage-path",
                    str(root / "ray"),
                    SCRIPT,
                    *SCRIPT_ARGS,
                ],
                env,
                root / "ray.log",
            )
            try:
                restarts = measure_restarts(events, sigkill_rank, count, alive=lambda: driver.poll() is None)
            except RuntimeError as e:
                raise RuntimeError(f"{e}\n{(root / 'ray.log').read_text(errors='replace')[-3000:]}") from None
            finally:
                stop(driver)
    figures = summary("ray_restart", restarts)
    baselines = summary("launch_restart", baseline)
    return BenchmarkResult(
        name="ray_restart",
        figures=figures,
        baselines=baselines,
        compared_to={f"ray_restart{k}": f"launch_restart{k}" for k in ("_s", "_max_s", "_to_start_s", "_to_heal_s")},
        notes="Kill (SIGKILL of g1's process) to g1's first commit after its heal, median of the restarts; "
        "_to_start_s: to the new process's start event. Ray: python -m replicaft.ray --groups 3 on a one-node "
        "Ray cluster (ray start --head on loopback, defaults: Ray Train polls its workers every 2 s); "
        "launcher: replicaft-launch --groups 3 with its defaults. Same script, same machine, one run.",
        params={"restarts": count, "script": "examples/train_ddp.py " + " ".join(SCRIPT_ARGS)},
    )
