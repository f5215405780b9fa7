"""Run a replicaft training script in R replica groups on a Ray cluster: ``replicaft-launch``
with Ray placing the groups on its nodes and restarting them.

The script is the one ``replicaft-launch`` runs (``examples/train_ddp.py``, yours): each Ray Train
worker runs it in-process, as ``__main__`` with its arguments, in the driver's working directory
where that exists on the worker's node (like Slurm, Ray expects the code at the same path on
every node). The script's exit status decides: 0 is a group that trained all its steps; anything
else (an exception, ``sys.exit(1)`` after a ``GroupBroken``) fails the worker, and Ray Train
replaces that group (backend.py) while the others carry on; a SIGKILLed worker likewise.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ray
import ray.train
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from replicaft.ray.backend import ReplicaftConfig

KEPT_PER_NODE = ("REPLICAFT_HOST", "REPLICAFT_LIGHTHOUSE", "REPLICAFT_REPLICA_ID")
"""Variables of the driver's environment never passed to the workers: each worker's own."""


class GroupExited(RuntimeError):
    """The script of one group exited with a non-zero status; Ray Train restarts that group."""


def worker_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What the driver passes every worker: its ``REPLICAFT_*`` settings (the per-node ones aside),
    one intra-op thread unless told otherwise, and no gRPC fork handlers (the launcher's reason:
    DataLoader workers forked beside gRPC's threads segfaulted with them)."""
    env = {k: v for k, v in environ.items() if k.startswith("REPLICAFT_") and k not in KEPT_PER_NODE}
    env["OMP_NUM_THREADS"] = environ.get("OMP_NUM_THREADS", "1")
    env["GRPC_ENABLE_FORK_SUPPORT"] = environ.get("GRPC_ENABLE_FORK_SUPPORT", "0")
    return env


def run_group(config: dict[str, Any]) -> None:
    """Ray Train's per-worker function: run the script as ``__main__``; a non-zero exit fails the worker."""
    if Path(config["cwd"]).is_dir():
        os.chdir(config["cwd"])
    sys.argv = [config["script"], *config["args"]]
    try:
        runpy.run_path(config["script"], run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            raise GroupExited(
                f"{os.environ.get('REPLICAFT_REPLICA_ID')}: {config['script']} exited with status {e.code}"
            ) from None


def run_script(
    script: str,
    args: Sequence[str],
    *,
    groups: int,
    max_restarts: int = 10,
    lighthouse_args: Sequence[str] = (),
    replica_prefix: str = "g",
    cpus_per_group: float = 1,
    gpu: bool = False,
    storage_path: str | None = None,
    name: str | None = None,
) -> ray.train.Result:
    """Train ``script`` in ``groups`` replica groups on the Ray cluster ``ray.init`` connects to
    (``RAY_ADDRESS``), each restarted at most ``max_restarts`` times in all (Ray's
    ``FailureConfig.max_failures``; -1: without limit). Returns Ray Train's result."""
    if groups < 1:
        raise ValueError(f"groups={groups}: at least one replica group")
    if not ray.is_initialized():
        ray.init(runtime_env={"env_vars": worker_env(os.environ)})
    resources = {"CPU": cpus_per_group} | ({"GPU": 1} if gpu else {})
    trainer = TorchTrainer(
        run_group,
        train_loop_config={"script": str(Path(script).resolve()), "args": list(args), "cwd": os.getcwd()},
        scaling_config=ScalingConfig(num_workers=groups, use_gpu=gpu, resources_per_worker=resources),
        torch_config=ReplicaftConfig(lighthouse_args=lighthouse_args, replica_prefix=replica_prefix),
        run_config=RunConfig(
            name=name, storage_path=storage_path, failure_config=FailureConfig(max_failures=max_restarts)
        ),
    )
    return trainer.fit()
