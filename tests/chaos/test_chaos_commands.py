"""The command lines and environments of a run's processes (chaos/commands.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from chaos.commands import EXAMPLE, GroupPlacement, group_command, group_env, lighthouse_command
from chaos.scenario import scenario_from_dict


def test_w1_group_is_the_script_and_w2_runs_under_torchrun() -> None:
    one = scenario_from_dict({"name": "a", "steps": 7, "width": 16})
    assert group_command(one)[:2] == [sys.executable, str(EXAMPLE)]
    two = scenario_from_dict({"name": "b", "ranks_per_group": 2})
    cmd = group_command(two)
    assert cmd[:7] == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(EXAMPLE),
    ]


def test_a_scenario_script_replaces_the_example_with_its_own_arguments(tmp_path: Path) -> None:
    script = tmp_path / "mine.py"
    script.write_text("")
    s = scenario_from_dict({"name": "a", "script": "mine.py", "script_args": ["--steps", "9"]}, base_dir=tmp_path)
    assert group_command(s) == [sys.executable, str(script), "--steps", "9"]


def test_group_env_carries_placement_checkpoints_and_fault_points() -> None:
    s = scenario_from_dict({"name": "a", "checkpoint_interval_steps": 10, "collective_timeout_s": 7.0})
    plain = group_env(s, "g1", GroupPlacement(lighthouse="127.0.0.1:5", events_dir=Path("/ev")))
    assert plain == {
        "REPLICAFT_LIGHTHOUSE": "127.0.0.1:5",
        "REPLICAFT_REPLICA_ID": "g1",
        "REPLICAFT_EVENTS_DIR": "/ev",
        "REPLICAFT_COLLECTIVE_TIMEOUT_S": "7.0",
    }
    placed = group_env(
        s,
        "g1",
        GroupPlacement(
            lighthouse="10.88.0.1:5",
            events_dir=Path("/ev"),
            checkpoint_dir=Path("/ck"),
            host="10.88.0.11",
            interface="eth0",
            fault_points="serve@3",
        ),
    )
    assert placed["REPLICAFT_HOST"] == "10.88.0.11" and placed["GLOO_SOCKET_IFNAME"] == "eth0"
    assert placed["REPLICAFT_CHECKPOINT_DIR"] == "/ck" and placed["REPLICAFT_CHECKPOINT_INTERVAL_STEPS"] == "10"
    assert placed["REPLICAFT_FAULT_POINTS"] == "serve@3"


def test_lighthouse_binds_the_lab_address_only_when_given() -> None:
    s = scenario_from_dict({"name": "a"})
    assert "--host" not in lighthouse_command(s, host=None, port=0)
    assert lighthouse_command(s, host="10.88.0.1", port=4242)[-2:] == ["--host", "10.88.0.1"]


def test_deterministic_scenario_sets_the_mode_and_the_global_batch() -> None:
    s = scenario_from_dict({"name": "d", "groups": 3, "deterministic": True, "virtual_shards": 6, "global_batch": 48})
    assert group_command(s)[-2:] == ["--batch-size", "48"]
    env = group_env(s, "g0", GroupPlacement(lighthouse="127.0.0.1:1", events_dir=Path("/tmp/e")))
    assert (env["REPLICAFT_DETERMINISTIC"], env["REPLICAFT_VIRTUAL_SHARDS"]) == ("1", "6")
    plain = scenario_from_dict({"name": "p"})
    assert "REPLICAFT_DETERMINISTIC" not in group_env(
        plain, "g0", GroupPlacement(lighthouse="127.0.0.1:1", events_dir=Path("/tmp/e"))
    )
    assert "--batch-size" not in group_command(plain)
