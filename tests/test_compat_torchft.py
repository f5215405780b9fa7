"""A torchft-style script runs on replicaft.compat.torchft and survives a SIGKILL of a group."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import REPO_ROOT, ManagedProcess, spawn_python, start_lighthouse

from replicaft.compat import torchft
from replicaft.errors import OptionsError

SCRIPT = str(REPO_ROOT / "tests" / "torchft_style_train.py")


def start(lighthouse: str, replica_id: str, steps: int) -> ManagedProcess:
    env = dict(os.environ, TORCHFT_LIGHTHOUSE=f"http://{lighthouse}", REPLICA_GROUP_ID=replica_id)
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return spawn_python(SCRIPT, str(steps), "0.1", name=replica_id, env=env)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_torchft_style_script_survives_a_killed_group_and_ends_identical(tmp_path: Path) -> None:
    lh = start_lighthouse(status=False)
    g0 = start(lh.grpc_address, "g0", 80)
    g1 = start(lh.grpc_address, "g1", 80)
    g1.wait_for_json(lambda o: o.get("event") == "step" and o["step"] >= 8, 90, what="g1 at step 8")
    g1.kill()
    g1 = start(lh.grpc_address, "g1", 80)
    _, final0 = g0.wait_for_json(lambda o: o.get("event") == "final", 120, what="g0 final weights")
    _, final1 = g1.wait_for_json(lambda o: o.get("event") == "final", 120, what="g1 final weights")
    assert g0.wait_exit(30) == 0 and g1.wait_exit(30) == 0
    assert final0["digest"] == final1["digest"]
    steps_after_restart = [o["step"] for o in g1.json_lines() if o.get("event") == "step"]
    assert steps_after_restart and steps_after_restart[0] > 8, "the restarted group should heal, not start over"


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"world_size_mode": torchft.WorldSizeMode.FIXED_WITH_SPARES}, "FIXED_WITH_SPARES"),
        ({"checkpoint_transport": object()}, "checkpoint_transport"),
        ({"lighthouse_addr": None}, "TORCHFT_LIGHTHOUSE"),
    ],
)
def test_unsupported_arguments_raise_a_clear_error(kwargs: dict, fragment: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHFT_LIGHTHOUSE", raising=False)
    args = dict(pg=torchft.ProcessGroupGloo(), load_state_dict=None, state_dict=None, min_replica_size=1,
                lighthouse_addr="127.0.0.1:1", replica_id="g0")
    args.update(kwargs)
    with pytest.raises(OptionsError, match=fragment):
        torchft.Manager(**args)
