"""``python -m replicaft.ray``: a replicaft training script in R replica groups on a Ray cluster.

    RAY_ADDRESS=HEAD:6379 python -m replicaft.ray --groups 4 examples/train_ddp.py --steps 2000

The flags mirror ``replicaft-launch``'s where they mean the same; Ray places the groups and
restarts a failed one (script.py). Exit status 0 once every group has trained all its steps;
1 when Ray Train gave up (``--max-restarts`` exhausted), with its error.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from replicaft.ray.script import run_script


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m replicaft.ray", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--groups", type=int, default=2, help="replica groups, one Ray Train worker each (default: 2)")
    p.add_argument(
        "--max-restarts",
        type=int,
        default=10,
        help="group restarts Ray may make in all before it fails the job; -1: no limit (default: 10)",
    )
    p.add_argument(
        "--lighthouse-args",
        default="",
        metavar="FLAGS",
        help='replicaft-lighthouse flags for the job\'s lighthouse, e.g. "--min-replicas 2"',
    )
    p.add_argument("--replica-prefix", default="g", help="replica ids are this and the group's number (default: g)")
    p.add_argument("--cpus-per-group", type=float, default=1, help="Ray CPUs each group holds (default: 1)")
    p.add_argument("--gpu", action="store_true", help="one GPU per group (NCCL)")
    p.add_argument("--storage-path", default=None, help="Ray Train's run storage (shared across nodes)")
    p.add_argument("--name", default=None, help="Ray Train's run name")
    p.add_argument("script", help="the training script every group runs")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import ray.train  # after parsing: --help needs no Ray

    try:
        run_script(
            args.script,
            args.script_args,
            groups=args.groups,
            max_restarts=args.max_restarts,
            lighthouse_args=shlex.split(args.lighthouse_args),
            replica_prefix=args.replica_prefix,
            cpus_per_group=args.cpus_per_group,
            gpu=args.gpu,
            storage_path=args.storage_path,
            name=args.name,
        )
    except ValueError as e:
        print(f"replicaft.ray: error: {e}", file=sys.stderr)
        return 2
    except ray.train.TrainingFailedError as e:
        print(f"replicaft.ray: training failed: {e}", file=sys.stderr)
        return 1
    print("replicaft.ray: every group trained all its steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
