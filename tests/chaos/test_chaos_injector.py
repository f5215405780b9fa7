"""Fault injection (chaos/injector.py) against a scripted fake of the runner's Supervision: when a
fault may fire, what it asks of the runner, how it is undone and recorded, and why one that never
fired was skipped. The real runner behind the same interface is exercised by the chaos runs."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from chaos.injector import Injector, Supervision
from chaos.job_view import JobView
from chaos.network import NetworkUnavailable
from chaos.record import ALL_GROUPS, LIGHTHOUSE
from chaos.scenario import NETWORK_KINDS, scenario_from_dict


class FakeRunner:
    """Groups are healthy when listed; every request is recorded."""

    def __init__(self, healthy: set[str], armed: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.job = JobView()
        self.healthy = set(healthy)
        self.armed = set(armed)
        self.calls: list[tuple[Any, ...]] = []
        self.lighthouse_up = True
        self.standby_up = False
        self.known_ranks: dict[tuple[str, int], bool] = {}

    def is_healthy(self, group: str) -> bool:
        return group in self.healthy

    def is_armed(self, group: str) -> bool:
        return group in self.armed

    def signal_group(self, group: str, sig: int, cause: str | None) -> None:
        self.calls.append(("signal", group, sig, cause))

    def kill_rank(self, group: str, rank: int, cause: str) -> bool:
        self.calls.append(("kill_rank", group, rank, cause))
        return self.known_ranks.get((group, rank), False)

    def kill_every_group(self, cause: str) -> None:
        self.calls.append(("kill_every_group", cause))

    def kill_lighthouse(self) -> bool:
        self.calls.append(("kill_lighthouse",))
        return self.lighthouse_up

    def standby_ready(self) -> bool:
        return self.standby_up


def setup(
    *faults: dict[str, Any],
    healthy: set[str] = frozenset({"g0", "g1", "g2"}),
    checkpoint_dir: Path | None = None,
    step: int = 10,
    **fields: Any,
) -> tuple[Injector, FakeRunner]:
    s = scenario_from_dict({"name": "t", "steps": 100, **fields, "faults": list(faults)})
    fake = FakeRunner(set(healthy), armed={f["target"] for f in faults if f["kind"] == "kill_donor_mid_heal"})
    fake.job.step = step
    fake.job.last_commit_ts = {g: 1.0 for g in s.group_ids}
    sup: Supervision = fake
    return Injector(s, sup, checkpoint_dir=checkpoint_dir), fake


def test_fault_waits_for_its_step() -> None:
    injector, fake = setup({"kind": "sigkill", "target": "g1", "at_step": 20})
    injector.inject_due()
    assert fake.calls == []
    fake.job.step = 20
    injector.inject_due()
    assert fake.calls == [("signal", "g1", signal.SIGKILL, "sigkill")]
    assert [(f.kind, f.target) for f in injector.injected] == [("sigkill", "g1")]


def test_fault_never_takes_down_the_last_healthy_group() -> None:
    injector, fake = setup({"kind": "sigterm", "target": "g1", "at_step": 5}, healthy={"g1"})
    injector.inject_due()
    assert fake.calls == []
    assert "last healthy group" in injector.skipped_reasons()[0][1]
    fake.healthy.add("g0")
    injector.inject_due()
    assert fake.calls == [("signal", "g1", signal.SIGTERM, "sigterm")]
    assert injector.skipped_reasons() == []


def test_stopped_group_is_continued_after_its_duration_and_counts_as_back() -> None:
    injector, fake = setup({"kind": "sigstop", "target": "g2", "at_step": 5, "duration_s": 3.0})
    injector.inject_due()
    assert fake.calls == [("signal", "g2", signal.SIGSTOP, None)]
    assert injector.impaired("g2")
    injector.undo_due(now_m=0.0)
    assert len(fake.calls) == 1, "not before its duration"
    injector.undo_due(now_m=float("inf"))
    assert fake.calls[-1] == ("signal", "g2", signal.SIGCONT, None)
    assert injector.injected[0].resumed_ts is not None and not injector.impaired("g2")


def test_with_warm_standby_a_restarting_fault_waits_for_a_ready_standby() -> None:
    injector, fake = setup(
        {"kind": "sigkill", "target": "g1", "at_step": 5},
        {"kind": "sigstop", "target": "g2", "at_step": 5, "duration_s": 1.0},
        warm_standby=True,
    )
    injector.inject_due()
    assert fake.calls == [("signal", "g2", signal.SIGSTOP, None)], "a hang restarts nothing: it does not wait"
    assert injector.skipped_reasons() == [
        ("sigkill g1 at step 5", "no warm standby was ready to restart it in (warm_standby = true)")
    ]
    fake.standby_up = True
    injector.inject_due()
    assert fake.calls[-1] == ("signal", "g1", signal.SIGKILL, "sigkill")


def test_rank_kill_waits_for_the_rank_pid() -> None:
    injector, fake = setup({"kind": "sigkill_rank", "target": "g1", "rank": 1, "at_step": 5}, ranks_per_group=2)
    injector.inject_due()
    assert injector.injected == [] and "pid of g1 rank 1" in injector.skipped_reasons()[0][1]
    fake.known_ranks[("g1", 1)] = True
    injector.inject_due()
    assert [f.kind for f in injector.injected] == ["sigkill_rank"]


def test_lighthouse_kill_waits_while_it_is_restarting() -> None:
    injector, fake = setup({"kind": "kill_lighthouse", "at_step": 5})
    fake.lighthouse_up = False
    injector.inject_due()
    assert injector.injected == []
    fake.lighthouse_up = True
    injector.inject_due()
    assert [(f.kind, f.target) for f in injector.injected] == [("kill_lighthouse", LIGHTHOUSE)]


def checkpoint(root: Path, step: int) -> None:
    path = root / f"step-{step:09d}"
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(bytes(64))


def test_kill_all_groups_waits_for_a_published_checkpoint(tmp_path: Path) -> None:
    injector, fake = setup(
        {"kind": "kill_all_groups", "at_step": 5}, checkpoint_dir=tmp_path, checkpoint_interval_steps=5
    )
    injector.inject_due()
    assert fake.calls == [] and "1 published checkpoint(s) needed, 0 found" in injector.skipped_reasons()[0][1]
    checkpoint(tmp_path, 5)
    injector.inject_due()
    assert fake.calls == [("kill_every_group", "kill_all_groups")]
    assert [(f.kind, f.target) for f in injector.injected] == [("kill_all_groups", ALL_GROUPS)]


def test_corrupt_checkpoint_damages_the_newest_of_two_after_killing_everyone(tmp_path: Path) -> None:
    injector, fake = setup(
        {"kind": "corrupt_checkpoint", "at_step": 5}, checkpoint_dir=tmp_path, checkpoint_interval_steps=5
    )
    checkpoint(tmp_path, 5)
    injector.inject_due()
    assert fake.calls == [], "one checkpoint is not enough: the resume needs an older one to fall back to"
    checkpoint(tmp_path, 10)
    injector.inject_due()
    assert fake.calls == [("kill_every_group", "corrupt_checkpoint")]
    (f,) = injector.injected
    assert f.checkpoint_step == 10 and "step-000000010/__0_0.distcp" in f.detail
    assert (tmp_path / "step-000000010" / "__0_0.distcp").read_bytes() != bytes(64)
    assert (tmp_path / "step-000000005" / "__0_0.distcp").read_bytes() == bytes(64)


def test_donor_death_is_recorded_when_the_armed_donor_kills_itself() -> None:
    injector, fake = setup({"kind": "kill_donor_mid_heal", "target": "g2", "healer": "g1", "at_step": 5})
    injector.inject_due()
    assert fake.calls == [("signal", "g1", signal.SIGKILL, "kill_donor_mid_heal")]
    assert [(f.kind, f.target) for f in injector.injected] == [("sigkill", "g1")]
    injector.inject_due()
    assert len(fake.calls) == 1, "the healer is killed once"
    assert "served no heal" in injector.skipped_reasons()[0][1]
    assert injector.self_inflicted("g2") == "kill_donor_mid_heal"
    assert [(f.kind, f.target) for f in injector.injected][-1] == ("kill_donor_mid_heal", "g2")
    assert injector.skipped_reasons() == []


@pytest.mark.parametrize("kind", sorted(NETWORK_KINDS))
def test_faults_without_their_environment_are_skipped_with_the_reason(kind: str) -> None:
    fault = {"kind": kind, "target": "g1", "at_step": 5, "duration_s": 2.0}
    if kind == "slow_link":
        fault["rate_mbit"] = 1.0
    injector, fake = setup(fault)
    injector.skip_unavailable(NETWORK_KINDS, "network namespaces are unavailable here: not root")
    injector.inject_due()
    assert fake.calls == []
    assert injector.skipped_reasons() == [
        (injector.scenario.faults[0].describe(), "network namespaces are unavailable here: not root")
    ]


def test_group_just_continued_is_not_healthy_until_it_commits_again() -> None:
    injector, fake = setup(
        {"kind": "sigstop", "target": "g2", "at_step": 5, "duration_s": 1.0},
        {"kind": "sigkill", "target": "g0", "at_step": 6},
        healthy={"g0", "g2"},
    )
    fake.job.last_commit_ts = {"g0": 1.0, "g2": 1.0}
    injector.inject_due()  # g2 stopped; g0 is now the last healthy group
    injector.undo_due(now_m=float("inf"))  # g2 continued, but the lighthouse dropped it: it must heal first
    injector.inject_due()
    assert [c[0:2] for c in fake.calls] == [("signal", "g2"), ("signal", "g2")]
    fake.job.last_commit_ts["g2"] = float("inf")  # g2 committed after it was back
    injector.inject_due()
    assert fake.calls[-1] == ("signal", "g0", signal.SIGKILL, "sigkill")


class LabWithoutNetem:
    """A network lab on a kernel without the netem qdisc (as on the development box)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def cut(self, name: str) -> None:
        self.calls.append(("cut", name))

    def restore(self, name: str) -> None:
        self.calls.append(("restore", name))

    def shape(self, name: str, rate_mbit: float | None, delay_ms: float | None) -> None:
        if delay_ms is not None:
            raise NetworkUnavailable(
                "`ip netns exec x tc qdisc add dev eth0 root netem delay 50ms` failed (exit 2): "
                "Error: Specified qdisc kind is unknown."
            )
        self.calls.append(("shape", name))

    def unshape(self, name: str) -> None:
        self.calls.append(("unshape", name))


def test_partition_cuts_then_restores_the_link() -> None:
    injector, fake = setup({"kind": "partition", "target": "g1", "at_step": 5, "duration_s": 8.0})
    lab = LabWithoutNetem()
    injector.use_network(lab)  # type: ignore[arg-type]
    injector.inject_due()
    assert lab.calls == [("cut", "g1")] and injector.impaired("g1")
    injector.undo_due(now_m=float("inf"))
    assert lab.calls == [("cut", "g1"), ("restore", "g1")] and not injector.impaired("g1")


def test_delay_on_a_kernel_without_netem_is_skipped_not_approximated() -> None:
    injector, fake = setup(
        {"kind": "slow_link", "target": "g1", "at_step": 5, "duration_s": 3.0, "delay_ms": 50.0},
        {"kind": "slow_link", "target": "g2", "at_step": 5, "duration_s": 3.0, "rate_mbit": 2.0},
    )
    lab = LabWithoutNetem()
    injector.use_network(lab)  # type: ignore[arg-type]
    injector.inject_due()
    assert lab.calls == [("shape", "g2")]
    ((what, why),) = injector.skipped_reasons()
    assert what.startswith("slow_link g1 +50 ms") and "qdisc kind is unknown" in why
