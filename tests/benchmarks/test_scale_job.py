"""The job simulator on small cases with known answers, on the real lighthouse rules."""

from __future__ import annotations

import pytest

from benchmarks.scale.faults import Fault
from benchmarks.scale.job import Job
from benchmarks.scale.params import Costs, JobShape
from benchmarks.scale.replicaft_lighthouse import ReplicaftLighthouse
from benchmarks.scale.steps import RoundCost
from benchmarks.scale.torchft_lighthouse import TorchftLighthouse
from lighthouse.config.options import MembershipOptions

COSTS = Costs()
SHAPE = JobShape(groups=4, step_s=1.0, step_sigma=0.0, state_bytes_per_gpu=1e9)
OPTIONS = MembershipOptions(join_timeout_s=5.0, progress_timeout_s=20.0)


def _run(system, faults, duration_s=600.0):
    return Job(SHAPE, COSTS, system, faults, duration_s=duration_s, round_cost=RoundCost({})).run()


def test_no_failures_goodput_is_one_less_the_first_rebuild_and_the_step_cut_by_the_end():
    out = _run(ReplicaftLighthouse(COSTS, OPTIONS), [])
    assert 1.0 - (SHAPE.step_s + COSTS.pg_rebuild_s) / 600.0 <= out.goodput <= 1.0
    assert out.quorum_sizes == [(0.0, 4)]


def test_one_kill_costs_the_survivors_about_the_aborted_step_and_the_victim_its_restart_and_heal():
    out = _run(ReplicaftLighthouse(COSTS, OPTIONS), [Fault(100.5, "kill", (1,))])
    sizes = [n for _, n in out.quorum_sizes]
    assert sizes == [4, 3, 4]
    # Survivors lose the half step they were in plus a rebuild; the victim its restart and heal.
    victim_s = 0.5 + COSTS.warm_restart_s + COSTS.heal_s(SHAPE.state_bytes_per_gpu)
    expected_s = 3 * (0.5 + COSTS.notice_s + COSTS.pg_rebuild_s) + victim_s
    assert out.lost_group_s["kill"] == pytest.approx(expected_s, abs=2.5)


def test_torchft_rules_make_the_survivors_wait_out_the_heartbeat_timeout():
    out = _run(TorchftLighthouse(COSTS), [Fault(100.5, "kill", (1,))])
    per_survivor_s = (out.lost_group_s["kill"] - 5.0) / 3
    assert per_survivor_s > 4.0  # the 5 s heartbeat expiry, not the step


def test_lighthouse_loss_waits_for_the_restart_and_the_restarted_lighthouse_grace():
    out = _run(ReplicaftLighthouse(COSTS, OPTIONS), [Fault(100.5, "lighthouse")])
    lost_per_group_s = out.lost_group_s["lighthouse"] / 4
    floor_s = COSTS.lighthouse_restart_s + COSTS.reconnect_s + OPTIONS.join_timeout_s
    assert floor_s <= lost_per_group_s <= floor_s + 2.5
