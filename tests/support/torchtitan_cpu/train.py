"""Run torchtitan 0.3.0's trainer (``torchtitan.train.main``) on CPU, as one rank of one group.

    python tests/support/torchtitan_cpu/train.py --module torchft.llama3 \
        --config llama3_torchft_debugmodel --checkpoint.enable ...

Run where it may write (torchtitan reads ``./tests/assets`` and writes ``--dump_folder``),
under ``replicaft-launch --torchft`` so ``import torchft`` is replicaft's shim. What it
changes before handing over, and nothing else:

* the CPU device module and eager masked attention (``cpu_patches.py``);
* torchrun's variables for a one-rank group (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
  ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT=0``: the store takes a free port);
* the group's place in the job from replicaft's launcher: ``--fault_tolerance.replica_id``
  is ``REPLICA_GROUP_ID`` and ``--fault_tolerance.group_size`` is ``NUM_REPLICA_GROUPS``
  (torchtitan names the manager's replica ``torchtitan_ft_<id>``: launch with
  ``--replica-prefix torchtitan_ft_`` so the launcher's ids are the same);
* the tokenizer and dataset (``assets.py``), and Hugging Face offline;
* ``--fault_tolerance.process_group gloo`` (the debug config's NCCL needs a GPU) and the
  profiler off (``--profiler.no-enable-profiling``: it records CUDA memory history).

Arguments given after these win (tyro keeps the last).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for support.*

from support.torchtitan_cpu.assets import ensure_assets  # noqa: E402
from support.torchtitan_cpu.cpu_patches import patch_torchtitan_for_cpu  # noqa: E402


def _group_arguments() -> list[str]:
    missing = [name for name in ("REPLICA_GROUP_ID", "NUM_REPLICA_GROUPS") if name not in os.environ]
    if missing:
        raise SystemExit(f"torchtitan_cpu/train.py: {', '.join(missing)} not set; run under replicaft-launch --torchft")
    return [
        "--fault_tolerance.replica_id", os.environ["REPLICA_GROUP_ID"],
        "--fault_tolerance.group_size", os.environ["NUM_REPLICA_GROUPS"],
        "--fault_tolerance.process_group", "gloo",
        "--profiler.no-enable-profiling",
    ]  # fmt: skip


def main() -> None:
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}.items():
        os.environ[name] = value
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", "0"
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(Path(".hf-home").resolve()))
    ensure_assets(Path.cwd())
    patch_torchtitan_for_cpu()
    from torchtitan.train import main as torchtitan_main

    sys.argv[1:] = [*_group_arguments(), *sys.argv[1:]]
    torchtitan_main()


if __name__ == "__main__":
    main()
