"""The checkpoint cadence rule (replicaft/checkpoint/cadence.py): tables of inputs and the interval chosen."""

from __future__ import annotations

import math

import pytest

from replicaft.checkpoint.cadence import (
    CadenceLimits,
    FailureHistory,
    daly_interval_s,
    decide_interval,
    estimate_total_mtbf,
    member_loss_mtbf_s,
    observe,
)
from replicaft.errors import OptionsError

LIMITS = CadenceLimits(min_s=10.0, max_s=3600.0, prior_mtbf_s=86400.0, min_total_failures=2)


@pytest.mark.parametrize(
    ("cost_s", "mtbf_s", "expected_s"),
    [
        (0.0, 1000.0, 0.0),  # free saves: as often as the bounds allow
        (1.0, 1e6, math.sqrt(2 * 1.0 * 1e6)),  # C << M: Young's sqrt(2CM), within 1%
        (10.0, 86400.0, math.sqrt(2 * 10 * 86400)),
        (100.0, 50.0, 50.0),  # C >= 2M: Daly says M
        (1.0, math.inf, math.inf),
    ],
)
def test_daly_interval_matches_young_for_cheap_saves(cost_s: float, mtbf_s: float, expected_s: float) -> None:
    assert daly_interval_s(cost_s, mtbf_s) == pytest.approx(expected_s, rel=1e-2)


def test_daly_interval_corrects_young_when_cost_is_not_small() -> None:
    # C = M/8: x = 1/16; sqrt(2CM) (1 + sqrt(x)/3 + x/9) - C
    c, m = 100.0, 800.0
    assert daly_interval_s(c, m) == pytest.approx(400 * (1 + 0.25 / 3 + 1 / 144) - 100)


@pytest.mark.parametrize(
    ("history", "source", "mtbf_s"),
    [
        # nothing seen: the prior
        (FailureHistory(), "prior", 86400.0),
        # one total failure is not enough to replace the prior
        (FailureHistory(observed_s=1000.0, total_failures=1, max_groups=2), "prior", 86400.0),
        # two total failures in 10000 s: every 5000 s
        (FailureHistory(observed_s=10000.0, total_failures=2, max_groups=2), "observed", 5000.0),
        # one group (no peer protection), a loss every 1000 s, down 10 s each: 1/λ + R
        (
            FailureHistory(observed_s=4000.0, group_s=4000.0, degraded_s=40.0, member_losses=4, max_groups=1),
            "member_losses",
            1010.0,
        ),
        # two groups, same per-group rate, 10 s repairs: u = 0.01/1.01, G λ (1-u) u -> ~ 51005 s
        (
            FailureHistory(observed_s=4000.0, group_s=8000.0, degraded_s=80.0, member_losses=8, max_groups=2),
            "member_losses",
            1 / (2 * 0.001 * (1 / 1.01) * (0.01 / 1.01)),
        ),
        # two groups, one of them away now: the one left is unprotected, 1/λ + R
        (
            FailureHistory(
                observed_s=4000.0, group_s=8000.0, degraded_s=80.0, member_losses=8, max_groups=2, groups_now=1
            ),
            "member_losses",
            1010.0,
        ),
        # eight groups: peers protect, independent overlap is far rarer than the prior
        (
            FailureHistory(observed_s=4000.0, group_s=32000.0, degraded_s=320.0, member_losses=32, max_groups=8),
            "prior",
            86400.0,
        ),
        # repairs that take no time: independent failures never overlap, the prior stands
        (FailureHistory(observed_s=4000.0, group_s=8000.0, member_losses=8, max_groups=2), "prior", 86400.0),
        # observed total failures outrank the member-loss estimate
        (
            FailureHistory(
                observed_s=9000.0, group_s=9000.0, degraded_s=90.0, member_losses=9, total_failures=3, max_groups=1
            ),
            "observed",
            3000.0,
        ),
    ],
    ids=[
        "nothing_seen",
        "one_total",
        "two_totals",
        "one_group",
        "two_groups",
        "one_of_two_now",
        "eight_groups",
        "instant_repair",
        "observed_wins",
    ],
)
def test_total_mtbf_estimate_by_source(history: FailureHistory, source: str, mtbf_s: float) -> None:
    estimate = estimate_total_mtbf(history, LIMITS)
    assert (estimate.source, estimate.seconds) == (source, pytest.approx(mtbf_s, rel=1e-6)), estimate.reason


def test_member_loss_mtbf_unknown_before_any_loss() -> None:
    assert member_loss_mtbf_s(FailureHistory(observed_s=100.0, group_s=200.0, max_groups=2)) is None


@pytest.mark.parametrize(
    ("blocked_s", "write_s", "history", "interval_s", "says"),
    [
        (None, None, FailureHistory(), 10.0, "no save measured yet"),
        # cost 2 s, prior 86400 s: sqrt(2*2*86400) ~ 588 s
        (0.5, 1.5, FailureHistory(), daly_interval_s(2.0, 86400.0), "Young/Daly"),
        # cheap saves, short MTBF: the rule asks for less than the lower bound
        (0.01, 0.01, FailureHistory(observed_s=100.0, total_failures=2), 10.0, "lower bound"),
        # a write longer than the lower bound and than the rule: never overlap saves
        (0.1, 30.0, FailureHistory(observed_s=20.0, total_failures=2), 30.0, "one write"),
        # expensive saves, rare failures: capped
        (60.0, 600.0, FailureHistory(), 3600.0, "capped at the upper bound"),
    ],
    ids=["unmeasured", "rule", "floor", "write_floor", "ceiling"],
)
def test_interval_within_limits(
    blocked_s: float | None, write_s: float | None, history: FailureHistory, interval_s: float, says: str
) -> None:
    decision = decide_interval(blocked_s=blocked_s, write_s=write_s, history=history, limits=LIMITS)
    assert decision.interval_s == pytest.approx(interval_s)
    assert says in decision.reason
    assert LIMITS.min_s <= decision.interval_s <= max(LIMITS.max_s, write_s or 0)


def test_observe_accounts_group_seconds_and_degraded_time() -> None:
    h = FailureHistory()
    h = observe(h, seconds=10.0, num_groups=3)
    h = observe(h, seconds=5.0, num_groups=2)  # one group down
    h = observe(h, seconds=0.0, num_groups=4)  # no time passed: only the size is learnt
    assert h == FailureHistory(
        observed_s=15.0, group_s=40.0, degraded_s=5.0, member_losses=0, total_failures=0, max_groups=4, groups_now=4
    )


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"min_s": 0.0, "max_s": 10.0, "prior_mtbf_s": 1.0}, "checkpoint_interval_min_s=0.0"),
        ({"min_s": 20.0, "max_s": 10.0, "prior_mtbf_s": 1.0}, "checkpoint_interval_max_s=10.0"),
        ({"min_s": 1.0, "max_s": 10.0, "prior_mtbf_s": -1.0}, "checkpoint_mtbf_prior_s=-1.0"),
    ],
)
def test_bad_limits_refused_by_name(kwargs: dict[str, float], names: str) -> None:
    with pytest.raises(OptionsError, match=names):
        CadenceLimits(**kwargs)
