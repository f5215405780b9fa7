"""The names users import are pinned: a change to the public surface is a deliberate one."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO_ROOT

import lighthouse
import replicaft
import replicaft.compat.torchft as torchft_compat

REPLICAFT_API = {
    "CheckpointCorrupt",
    "DiLoCo",
    "DistributedDataParallel",
    "ExactlyOnceSampler",
    "FaultTolerantFSDP",
    "GroupBroken",
    "GroupError",
    "HealError",
    "LocalSGD",
    "ManagedProcessGroup",
    "ManagedWork",
    "Manager",
    "ManagerOptions",
    "Optimizer",
    "OptionsError",
    "ReplicaftError",
    "StateError",
    "StepDataLoader",
    "StepHooks",
    "StepMismatch",
    "shard_optimizer_state",
}


def test_replicaft_exports_exactly_the_public_names_and_each_resolves() -> None:
    assert set(replicaft.__all__) == REPLICAFT_API
    for name in replicaft.__all__:
        assert getattr(replicaft, name) is not None, name


CHECKPOINT_API = {
    "Catalog",
    "CheckpointFacts",
    "CheckpointInfo",
    "CheckpointReader",
    "CheckpointWriter",
    "LoadedCheckpoint",
    "RetentionDecision",
    "RetentionPolicy",
    "SaveDecision",
    "SaveHandle",
    "SaveResult",
    "SpaceDecision",
    "WriterStatistics",
    "decide_retention",
    "enough_space",
    "should_save",
}


def test_replicaft_checkpoint_exports_the_retention_and_catalog_names_issue_23() -> None:
    import replicaft.checkpoint

    assert set(replicaft.checkpoint.__all__) == CHECKPOINT_API
    for name in replicaft.checkpoint.__all__:
        assert getattr(replicaft.checkpoint, name).__name__ == name


def test_every_replicaft_error_is_a_replicaft_error_options_error_included() -> None:
    for name in (
        "CheckpointCorrupt",
        "GroupBroken",
        "GroupError",
        "HealError",
        "OptionsError",
        "StateError",
        "StepMismatch",
    ):
        assert issubclass(getattr(replicaft, name), replicaft.ReplicaftError), name
    assert issubclass(replicaft.OptionsError, lighthouse.errors.OptionsError)


def test_importing_replicaft_runs_no_torch_import() -> None:
    code = "import sys, replicaft, lighthouse; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert out.stdout.strip() == "False"


def test_a_training_process_loads_no_lighthouse_server() -> None:
    # The server side (its metrics registry, prometheus-client, the etcd client) cost every
    # cold restart of a group about 0.1 s before its first step.
    code = (
        "import sys, replicaft; replicaft.Manager, replicaft.DistributedDataParallel, replicaft.Optimizer; "
        "print(sorted(m for m in sys.modules if m in ('lighthouse.server.grpc_server', 'lighthouse.replicated.server', "
        "'lighthouse.replicated.etcd.client')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_loading_the_training_side_leaves_the_garbage_collector_as_the_script_set_it() -> None:
    # The lazy import pauses the collector (replicaft/__init__.py); on, or off, it is put back.
    code = (
        "import gc, sys, replicaft; gc.disable() if sys.argv[1] == 'off' else None; replicaft.Manager; "
        "replicaft.DistributedDataParallel; print(gc.isenabled())"
    )
    for state, expected in (("on", "True"), ("off", "False")):
        out = subprocess.run(
            [sys.executable, "-c", code, state], capture_output=True, text=True, cwd=REPO_ROOT, check=True
        )
        assert out.stdout.strip() == expected, state


def test_lighthouse_exports_resolve() -> None:
    for name in lighthouse.__all__:
        assert getattr(lighthouse, name) is not None, name


def test_torchft_compat_keeps_the_names_torchft_users_import() -> None:
    """torchft 0.2.0's top level, as its scripts import it."""
    assert set(torchft_compat.__all__) == {
        "DistributedDataParallel",
        "DistributedSampler",
        "Manager",
        "Optimizer",
        "ProcessGroupBabyNCCL",
        "ProcessGroupBabyXCCL",
        "ProcessGroupGloo",
        "ProcessGroupNCCL",
        "ProcessGroupXCCL",
        "WorldSizeMode",
    }
    for name in torchft_compat.__all__:
        assert getattr(torchft_compat, name) is not None, name
    from replicaft.compat.torchft.optim import OptimizerWrapper

    assert OptimizerWrapper is not None
