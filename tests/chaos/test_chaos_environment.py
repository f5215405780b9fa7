"""What a run needs from the machine (chaos/environment.py): built only when a fault needs it, and
when it cannot be built the run goes on without it, naming the faults to skip and why."""

from __future__ import annotations

from pathlib import Path

import pytest

import chaos.environment
from chaos.disk import DiskUnavailable
from chaos.environment import RunEnvironment
from chaos.network import NetworkUnavailable
from chaos.scenario import NETWORK_KINDS, scenario_from_dict

PARTITION = {"kind": "partition", "target": "g1", "at_step": 3, "duration_s": 2.0}
FILL = {"kind": "fill_disk", "at_step": 3, "duration_s": 2.0}


class NoNamespaces:
    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def create(self) -> None:
        raise NetworkUnavailable("`ip netns add x` failed (exit 1): Operation not permitted")


class NoMount:
    def __init__(self, path: Path) -> None:
        self.path = path

    def mount(self) -> None:
        raise DiskUnavailable("`mount -t tmpfs ...` failed (exit 32): permission denied")


def test_plain_scenario_builds_nothing(tmp_path: Path) -> None:
    env = RunEnvironment(scenario_from_dict({"name": "x"}), None)
    env.build()
    assert (env.lab, env.disk, env.unavailable, env.notes) == (None, None, [], {"network": "loopback"})
    env.close()


def test_without_namespaces_network_faults_are_skipped_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chaos.environment, "NetworkLab", NoNamespaces)
    env = RunEnvironment(scenario_from_dict({"name": "x", "faults": [PARTITION]}), None)
    env.build()
    assert env.lab is None
    ((kinds, reason),) = env.unavailable
    assert kinds == NETWORK_KINDS and "Operation not permitted" in reason and "loopback" in reason
    assert env.notes["network"].startswith("loopback (")


def test_without_a_tmpfs_fill_disk_is_skipped_and_the_real_disk_is_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(chaos.environment, "SmallDisk", NoMount)
    s = scenario_from_dict({"name": "x", "checkpoint_interval_steps": 5, "faults": [FILL]})
    env = RunEnvironment(s, tmp_path / "checkpoints")
    env.build()
    assert env.disk is None
    ((kinds, reason),) = env.unavailable
    assert kinds == {"fill_disk"} and "never filled" in reason and "permission denied" in reason
    assert env.notes["checkpoint_dir"] == str(tmp_path / "checkpoints")
