"""When silence means hung (lighthouse/rules/liveness.py): a table of cadences and silences."""

from __future__ import annotations

import random

import pytest

from lighthouse.rules.liveness import (
    LAG_WINDOW_S,
    LivenessRules,
    LoopLag,
    is_silent_too_long,
    silence_limit,
)

RULES = LivenessRules(heartbeat_timeout_s=2.0, hung_factor=3.0, hung_min_s=0.25, min_gaps=8)


@pytest.mark.parametrize(
    ("case", "gaps", "interval_s", "limit_s", "basis"),
    [
        (
            "0.1 s heartbeats, slow steps",
            [0.1, 0.1, 0.102, 0.1, 0.1, 0.1, 0.1, 0.1],
            0.1,
            0.302,
            "its longest gap 0.102s + 2 heartbeat intervals of 0.1s",
        ),
        ("fast steps: the declared interval still bounds the gaps", [0.03] * 16, 0.1, 0.3, "its longest gap 0.100s"),
        ("0.25 s heartbeats", [0.25] * 10, 0.25, 0.75, "its longest gap 0.250s + 2 heartbeat intervals of 0.25s"),
        ("very fast heartbeats: the floor", [0.01] * 20, 0.01, 0.25, "hung_min_s=0.25"),
        (
            "a loaded machine's late heartbeat raises its own limit",
            [0.1] * 10 + [0.5],
            0.1,
            0.7,
            "its longest gap 0.500s",
        ),
        (
            "gaps this long: the ceiling",
            [0.1] * 10 + [1.9],
            0.1,
            2.0,
            "heartbeat_timeout_s=2, below its longest gap 1.900s",
        ),
        ("just registered: the ceiling until 8 gaps", [0.1] * 7, 0.1, 2.0, "7 of 8 gaps observed"),
        ("no interval declared: the ceiling", [0.1] * 20, 0.0, 2.0, "no heartbeat interval declared"),
        ("healing: the ceiling, whatever the cadence", [0.1] * 20, 0.1, 2.0, "while it heals"),
    ],
)
def test_silence_limit_follows_the_members_cadence(
    case: str, gaps: list[float], interval_s: float, limit_s: float, basis: str
) -> None:
    limit = silence_limit(gaps, len(gaps), interval_s, RULES, healing=case.startswith("healing"))
    assert limit.limit_s == pytest.approx(limit_s), case
    assert basis in limit.basis, case


@pytest.mark.parametrize(
    ("case", "silent_s", "gaps", "hung"),
    [
        ("SIGSTOP of a 0.11 s stepper, 0.30 s silent: not yet", 0.30, [0.11] * 16, False),
        ("SIGSTOP of a 0.11 s stepper, 0.32 s silent: hung", 0.32, [0.11] * 16, True),
        ("a 0.05 s stepper whose step slows: one heartbeat interval of quiet is fine", 0.12, [0.05] * 16, False),
        ("under the floor, whatever the cadence", 0.2, [0.01] * 16, False),
        ("silent past the ceiling, even with no history", 2.01, [], True),
        ("no history, silent 1.9 s: not yet", 1.9, [], False),
    ],
)
def test_hung_only_when_silent_beyond_the_limit(case: str, silent_s: float, gaps: list[float], hung: bool) -> None:
    assert (is_silent_too_long(silent_s, gaps, len(gaps), 0.1, RULES) is not None) is hung, case


def test_the_lighthouses_own_lag_extends_every_limit() -> None:
    """1,024 members heartbeating made the lighthouse's loop late, every member looked silent,
    and 600 live members were dropped: silence the lighthouse caused is allowed for."""
    gaps = [0.1] * 16
    assert is_silent_too_long(0.45, gaps, 16, 0.1, RULES) is not None
    extended = is_silent_too_long(0.45, gaps, 16, 0.1, RULES, allowance_s=0.3)
    assert extended is None
    late = is_silent_too_long(0.65, gaps, 16, 0.1, RULES, allowance_s=0.3)
    assert late is not None and "+ 0.30s for the lighthouse's own lag" in late.basis


def test_loop_lag_remembers_the_latest_tick_of_its_window() -> None:
    lag = LoopLag()
    lag.observe(10.0, 10.0)
    assert lag.allowance_s() == 0.0
    lag.observe(11.0, 10.75)  # 0.25 s late
    lag.observe(11.1, 11.08)
    assert lag.allowance_s() == pytest.approx(0.5)
    lag.observe(11.0 + LAG_WINDOW_S + 0.1, 11.0 + LAG_WINDOW_S + 0.1)
    assert lag.allowance_s() == pytest.approx(0.04)


def test_loop_lag_is_the_plain_maximum_of_its_window_over_any_ticks() -> None:
    rng = random.Random(7)
    lag, seen = LoopLag(), []
    now = 0.0
    for _ in range(2000):
        now += rng.uniform(0.0, 0.05)
        late = rng.choice([0.0, rng.uniform(0.0, 0.3)])
        lag.observe(now, now - late)
        seen.append((now, late))
        window = [x for t, x in seen if t >= now - LAG_WINDOW_S and x > 0]
        assert lag.allowance_s() == pytest.approx(2 * max(window, default=0.0))
