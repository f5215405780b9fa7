"""The scale benchmark's alternatives and figures on cases with known answers (all pure, seconds)."""

from __future__ import annotations

import json
import math
import random

import pytest

from benchmarks.results import BenchmarkResult
from benchmarks.scale import benchmark, left_out
from benchmarks.scale.checkpoint_job import CheckpointPlan, CheckpointRestartJob
from benchmarks.scale.compare import Config, quorum_summary, simulate
from benchmarks.scale.faults import Fault
from benchmarks.scale.job import Job
from benchmarks.scale.params import Costs, FaultRates, JobShape
from benchmarks.scale.replicaft_lighthouse import ReplicaftLighthouse
from benchmarks.scale.steps import RoundCost, step_moments, sum_of_steps
from benchmarks.scale.torchft_lighthouse import TorchftLighthouse, TorchftOptions
from lighthouse.config.options import MembershipOptions

COSTS = Costs()
OPTIONS = MembershipOptions(join_timeout_s=10.0)


@pytest.mark.parametrize("groups", [4, 256])
def test_no_failures_every_alternative_keeps_all_its_work(groups):
    config = Config(JobShape(groups=groups), FaultRates(), duration_s=24 * 3600.0)
    out = simulate(config, COSTS, RoundCost({}), OPTIONS)
    for name, outcome in out.items():
        assert outcome.goodput == pytest.approx(1.0, abs=1e-3), name
        assert outcome.faults == {}
    assert out["checkpoint_restart"].goodput == 1.0  # no failure: no checkpoint is worth its cost


def _victim_and_survivors(state_bytes: float) -> float:
    shape = JobShape(groups=4, step_s=1.0, step_sigma=0.0, state_bytes_per_gpu=state_bytes)
    system = ReplicaftLighthouse(COSTS, OPTIONS)
    return Job(shape, COSTS, system, [Fault(100.5, "kill", (1,))], duration_s=300.0, round_cost=RoundCost({})).run()


def test_one_kill_costs_the_calibrated_heal_more_when_the_state_is_larger():
    """The restart+heal model: the same kill with 8 GB instead of 1 GB per GPU costs the victim
    exactly the longer fetch (within the step its heal ends in), and the survivors nothing more."""
    small, large = _victim_and_survivors(1e9), _victim_and_survivors(8e9)
    extra_s = COSTS.heal_s(8e9) - COSTS.heal_s(1e9)
    assert large.lost_group_s["kill"] - small.lost_group_s["kill"] == pytest.approx(extra_s, abs=1.0 + 1e-6)
    assert [n for _, n in large.quorum_sizes] == [4, 3, 4]


def test_torchft_rules_lose_the_whole_job_to_a_lighthouse_loss_and_the_replicated_lighthouse_almost_nothing():
    shape = JobShape(groups=4, step_s=1.0, step_sigma=0.0, state_bytes_per_gpu=1e9)
    loss = [Fault(1000.5, "lighthouse")]

    def run(system):
        return Job(shape, COSTS, system, loss, duration_s=3000.0, round_cost=RoundCost({})).run()

    torchft = run(TorchftLighthouse(COSTS)).lost_job_s_per_fault()["lighthouse"]
    replicated = run(ReplicaftLighthouse(COSTS, OPTIONS, replicated=True)).lost_job_s_per_fault()["lighthouse"]
    # torchft: every group exits, the job restarts and redoes what its periodic checkpoint missed.
    assert torchft >= COSTS.job_restart_s + 1000.0 % 1800.0
    # replicaft replicated: the failover and a reconnect; the new leader waits only for the last quorum's members.
    assert replicated <= COSTS.lighthouse_failover_s + COSTS.reconnect_s + 2 * shape.step_s


def test_checkpoint_restart_loses_the_unsaved_work_and_the_restart_per_failure():
    shape = JobShape(groups=16, state_bytes_per_gpu=10e9)
    plan = CheckpointPlan(checkpoint_s=2.0, restart_s=100.0, mtbf_s=3600.0, interval_s=500.0)
    # Saved at 500 (+2 s blocked) and 1002 (+2); the kill at 1300 loses 296 s of work and the restart.
    out = CheckpointRestartJob(shape, COSTS, plan, [Fault(1300.0, "kill", (3,))], duration_s=2000.0).run()
    assert out.lost_group_s["kill"] / shape.groups == pytest.approx(296.0 + 100.0)
    assert out.goodput * 2000.0 == pytest.approx(2000.0 - 396.0 - 3 * 2.0)  # three saves: 500, 1002, then 1904
    preempted = CheckpointRestartJob(shape, COSTS, plan, [Fault(1300.0, "preempt", (3,))], duration_s=2000.0).run()
    assert preempted.lost_group_s["preempt"] / shape.groups == pytest.approx(2.0 + 100.0)  # saved on notice


@pytest.mark.parametrize(("factor", "within"), [(1.0, 0.002), (20.0, 0.04)])
def test_young_daly_interval_and_the_simulated_goodput_agree_with_the_closed_form(factor, within):
    shape, rates = JobShape(groups=512), FaultRates.llama3().scaled(factor)
    plan = CheckpointPlan.young_daly(shape, COSTS, rates)
    assert plan.interval_s == pytest.approx(math.sqrt(2 * plan.checkpoint_s * plan.mtbf_s))
    config = Config.expecting(shape, rates, 2000, min_h=1, max_h=1e6)
    out = simulate(config, COSTS, RoundCost({}), OPTIONS, systems=["checkpoint_restart"])["checkpoint_restart"]
    # Daly's form restarts a restart that a failure strikes; the simulation absorbs it (a bit higher).
    assert 0 <= out.goodput - plan.closed_form_goodput() <= within


def test_the_job_fails_at_llama3s_rate():
    """419 interruptions in 54 days on 2,048 hosts: one every 3.09 h, racks counted once each."""
    assert 1 / (FaultRates.llama3().per_group_h() * 2048) == pytest.approx(54 * 24 / 419)


def test_a_long_leap_draws_the_steps_sum_around_the_mean_step():
    shape = JobShape(groups=2048)
    mean, _ = step_moments(2048, shape)
    rng = random.Random(3)
    totals = [sum_of_steps(2048, shape, 0.0, 3600.0, rng) for _ in range(200)]
    assert all(steps == int(3600.0 / mean) - 2 and took < 3600.0 - mean for steps, took in totals)
    assert sum(t for _, t in totals) / len(totals) == pytest.approx(totals[0][0] * mean, rel=1e-4)


def test_quorum_summary_weights_each_size_by_how_long_it_held():
    out = _victim_and_survivors(1e9)
    q = quorum_summary(out)
    assert q["min"] == 3 and q["changes"] == 2 and q["mean"] == pytest.approx(4.0, abs=0.05)
    assert 0.95 < q["full_share"] < 1.0


@pytest.mark.parametrize("ratio", [0.5, 1.5, 4.0])
@pytest.mark.parametrize(("kind", "back_after_s"), [("kill", 0.0), ("host", 41.0)])
def test_a_step_longer_than_the_join_timeout_leaves_no_group_out_after_a_failure(ratio, kind, back_after_s):
    """With the join timeout run from the first waiter, a step 1.15 times it or longer left one
    group out of every quorum after a kill (left_out.py); it runs from the last quorum's first."""
    run = left_out.one_fault(ReplicaftLighthouse(COSTS, MembershipOptions()), 3, 2.0 * ratio, kind, back_after_s, COSTS)
    assert run["full_again"] == 1.0 and run["short_quorum_share"] == 0.0, run


def test_torchfts_rules_still_leave_a_group_out_after_a_host_returns_late_in_a_step():
    torchft_timeout_s = TorchftOptions().join_timeout_s
    step_s = 1.5 * torchft_timeout_s
    run = left_out.one_fault(TorchftLighthouse(COSTS), 3, step_s, "host", 10.7 * step_s, COSTS)
    assert run["full_again"] == 0.0 and run["short_quorum_share"] == 1.0, run


def test_the_benchmark_writes_its_figures_and_page(tmp_path, monkeypatch):
    monkeypatch.setattr(benchmark, "GROUPS_QUICK", (4, 8))
    monkeypatch.setattr(benchmark, "RATE_GROUPS_QUICK", 4)
    monkeypatch.setattr(benchmark, "FAULTS_QUICK", 2)
    monkeypatch.setattr(benchmark, "RATE_FACTORS", {"llama3": 1.0, "x100": 100.0})
    monkeypatch.setattr(benchmark, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(left_out, "RATIOS", (0.5, 1.5))
    result = benchmark.run(quick=True)
    assert isinstance(result, BenchmarkResult)
    assert set(result.figures) >= {"goodput_replicaft_8g", "goodput_torchft_8g", "goodput_replicaft_x100"}
    assert result.baselines["goodput_checkpoint_restart_8g"] > 0
    assert result.figures["left_out_smallest_step_to_join_timeout_ratio"] == 0.0  # none left out
    json.dumps(result.to_record(when="now", machine={}))
    page = (tmp_path / "scale.html").read_text()
    assert page.count("<svg") == 3 and "checkpoint_restart" in page and "real chaos runs" in page
