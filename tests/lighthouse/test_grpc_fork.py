"""gRPC's fork support is off in every process that imports the lighthouse package, under any
launcher (issue 43): with it on, a DataLoader worker forked beside gRPC's threads under plain
torchrun skipped gRPC's fork handlers ("Other threads are currently calling into gRPC,
skipping fork() handlers") and died of a segmentation fault."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO_ROOT

SKIPPED = "skipping fork() handlers"


def fork_beside_grpc(setting: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}  # as a fresh shell has it
    if setting is not None:
        env["GRPC_ENABLE_FORK_SUPPORT"] = setting
    env["PYTHONPATH"] = str(REPO_ROOT)
    script = str(REPO_ROOT / "tests" / "support" / "grpc_fork.py")
    return subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=60)


def test_importing_lighthouse_turns_grpcs_fork_support_off_and_forks_skip_no_handler() -> None:
    run = fork_beside_grpc(None)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "GRPC_ENABLE_FORK_SUPPORT=0" in run.stdout
    assert SKIPPED not in run.stderr, run.stderr[-2000:]


def test_a_setting_the_environment_gives_is_kept() -> None:
    env = {**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "1", "PYTHONPATH": str(REPO_ROOT)}
    code = "import os, lighthouse; print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "1", run.stderr[-2000:]
