"""checkpoint_interval="auto": the options, and the shell that feeds the cadence rule
(replicaft/persistence/cadence.py).

A fake clock and a list of emitted events stand in for time and the event log; the rule itself
is tested in test_checkpoint_cadence.py, and a real training process in test_cadence_training.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from lighthouse.wire.protocol import Notice
from replicaft.checkpoint.cadence import CadenceLimits, FailureHistory, daly_interval_s
from replicaft.config.options import ManagerOptions
from replicaft.errors import OptionsError
from replicaft.persistence.cadence import AutoCadence

BASE = {"lighthouse": "127.0.0.1:1", "replica_id": "g0", "checkpoint_dir": "/tmp/ckpt"}


def test_auto_interval_read_from_env_with_its_bounds() -> None:
    o = ManagerOptions.from_env(
        {
            "REPLICAFT_CHECKPOINT_INTERVAL": "auto",
            "REPLICAFT_CHECKPOINT_INTERVAL_MIN_S": "2",
            "REPLICAFT_CHECKPOINT_INTERVAL_MAX_S": "20",
            "REPLICAFT_CHECKPOINT_MTBF_PRIOR_S": "900",
        },
        lighthouse="127.0.0.1:1",
        replica_id="g0",
        checkpoint_dir="/tmp/ckpt",
    )
    assert (
        o.checkpoint_interval,
        o.checkpoint_interval_min_s,
        o.checkpoint_interval_max_s,
        o.checkpoint_mtbf_prior_s,
    ) == ("auto", 2.0, 20.0, 900.0)
    assert (o.checkpoint_interval_steps, o.checkpoint_interval_s) == (0, 0.0), "auto takes no fixed default"


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"checkpoint_interval": "sometimes"}, "checkpoint_interval='sometimes'"),
        ({"checkpoint_interval": "auto", "checkpoint_interval_steps": 10}, "checkpoint_interval_steps=10"),
        ({"checkpoint_interval": "auto", "group_world_size": 2, "group_store": "127.0.0.1:2"}, "group_world_size=2"),
        (
            {"checkpoint_interval": "auto", "checkpoint_interval_min_s": 30.0, "checkpoint_interval_max_s": 10.0},
            "checkpoint_interval_max_s=10.0",
        ),
        ({"checkpoint_interval": "auto", "checkpoint_mtbf_prior_s": 0.0}, "checkpoint_mtbf_prior_s=0.0"),
    ],
)
def test_bad_auto_interval_options_refused_by_name(fields: dict[str, Any], names: str) -> None:
    with pytest.raises(OptionsError, match=names):
        ManagerOptions(**{**BASE, **fields})


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make() -> tuple[AutoCadence, Clock, list[tuple[str, dict[str, Any]]]]:
    clock = Clock()
    events: list[tuple[str, dict[str, Any]]] = []
    cadence = AutoCadence(
        CadenceLimits(min_s=1.0, max_s=600.0, prior_mtbf_s=1000.0),
        lambda event, **fields: events.append((event, fields)),
        clock,
    )
    return cadence, clock, events


def test_member_losses_counted_once_per_member_and_quorum() -> None:
    cadence, clock, _ = make()
    cadence.observe(3)
    lost = Notice("member_lost", 7, "g2", "stream broken", 1)
    cadence.notice(lost)
    cadence.notice(lost)  # a failover's repeat
    cadence.notice(Notice("member_left", 7, "g1", "done", 1))  # graceful: not a failure
    cadence.notice(Notice("quorum_formed", 8, "", "", 1))
    clock.now += 10
    cadence.observe(2)
    assert cadence.history == FailureHistory(
        observed_s=10.0, group_s=20.0, degraded_s=10.0, member_losses=1, max_groups=3, groups_now=2
    )


def test_interval_reported_with_inputs_first_and_when_it_moves() -> None:
    cadence, clock, events = make()
    cadence.observe(1)
    assert cadence.interval_s() == 1.0  # unmeasured: the lower bound
    cadence.save_measured(0.5, 1.5)
    assert cadence.interval_s() == pytest.approx(daly_interval_s(2.0, 1000.0))
    cadence.save_measured(0.5, 1.6)  # a 2.5% change of cost: no new report
    cadence.interval_s()
    assert [e for e, _ in events] == ["checkpoint_cadence", "checkpoint_cadence"]
    first, second = events[0][1], events[1][1]
    assert (first["cost_s"], first["mtbf_source"], "no save measured" in first["reason"]) == (None, "prior", True)
    assert (second["blocked_s"], second["write_s"], second["cost_s"], second["mtbf_s"]) == (0.5, 1.5, 2.0, 1000.0)
    assert second["interval_s"] == pytest.approx(daly_interval_s(2.0, 1000.0))
    assert second["history"]["max_groups"] == 1


def test_history_travels_as_state_and_a_resume_counts_a_total_failure() -> None:
    donor, clock, _ = make()
    donor.observe(2)
    clock.now += 50
    donor.observe(2)
    healer, _, _ = make()
    healer.load_state_dict(donor.state_dict())
    assert healer.history == donor.history
    healer.resumed()
    assert healer.history.total_failures == 1


def test_malformed_history_ignored_and_kept() -> None:
    cadence, _, _ = make()
    cadence.observe(4)
    cadence.load_state_dict({"observed_s": -1.0})
    assert cadence.history.max_groups == 4
