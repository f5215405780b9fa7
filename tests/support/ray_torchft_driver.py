"""Ray Train's own torchft example, on the shim: the driver the Ray test runs (tests/replicaft/ray/test_ray.py).

The training function is ``train_func`` of ``ray/train/v2/examples/pytorch/torchft_linear_example.py``
as Ray 2.58 ships it, and the backend Ray's ``TorchftConfig`` (its lighthouse actor, a replica
group per worker, replacement of a failed group), both unmodified; ``import torchft`` resolves
to replicaft's shim because the alias folder leads ``PYTHONPATH``, here and, through the job's
runtime environment, in every Ray worker. What this driver does differently from the example's
own ``train_torchft``: 3 workers (not 2); ``FailureConfig(max_failures=3)`` (the example sets
none, and Ray's default, 0, fails the run at the first lost worker instead of replacing it);
``training_requires_all_workers=False``, the example's own switch for runs that lose a worker
(``ray.train.report`` waits for every worker, so survivors would wait at its barrier for the
replacement); a step count from the command line; and a JSON line with the result at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import ray
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from ray.train.v2.examples.pytorch.torchft_linear_example import train_func
from ray.train.v2.torch.torchft_config import TorchftConfig

from replicaft.ray.script import worker_env


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--groups", type=int, default=3)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--storage-path", required=True)
    args = p.parse_args()
    import torchft

    print(json.dumps({"event": "torchft_is", "file": torchft.__file__}), flush=True)
    ray.init(runtime_env={"env_vars": worker_env(os.environ) | {"PYTHONPATH": os.environ["PYTHONPATH"]}})
    trainer = TorchTrainer(
        train_loop_per_worker=train_func,
        train_loop_config={"num_steps": args.steps, "training_requires_all_workers": False},
        scaling_config=ScalingConfig(num_workers=args.groups, use_gpu=False),
        torch_config=TorchftConfig(lighthouse_kwargs={"min_replicas": 1}, backend="gloo"),
        run_config=RunConfig(storage_path=args.storage_path, failure_config=FailureConfig(max_failures=3)),
    )
    result = trainer.fit()
    print(
        json.dumps({"event": "ray_result", "error": None if result.error is None else repr(result.error)}), flush=True
    )
    return 0 if result.error is None else 1


if __name__ == "__main__":
    sys.exit(main())
