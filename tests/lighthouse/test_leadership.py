"""The lease rule (lighthouse/replicated/leadership.py): a leader stops serving before etcd could let
another lead, counting from when it sent each keepalive."""

from __future__ import annotations

import pytest

from lighthouse.replicated.leadership import LEASE_MARGIN, LeaseClock, takeover_notices


def test_nothing_is_valid_before_the_first_renewal() -> None:
    assert not LeaseClock(2.0).valid(0.0)


@pytest.mark.parametrize(
    ("case", "sent_at", "answered_at", "now", "valid"),
    [
        ("just renewed", 10.0, 10.01, 10.02, True),
        ("answered late: counted from the send, not the answer", 10.0, 11.5, 11.59, True),
        ("the margin before etcd's expiry", 10.0, 10.01, 10.0 + 2.0 * (1 - LEASE_MARGIN), False),
        ("partitioned: no renewal for a whole lease", 10.0, 10.01, 12.0, False),
    ],
)
def test_valid_only_until_the_margin_before_etcds_earliest_expiry(
    case: str, sent_at: float, answered_at: float, now: float, valid: bool
) -> None:
    clock = LeaseClock(2.0).renewed(sent_at, 2.0)
    assert clock.valid(now) is valid, case
    # etcd expires the lease no earlier than ttl after it received the keepalive, which it
    # did after we sent it: whenever we are still valid, so is the lease in etcd.
    if clock.valid(now):
        assert now < sent_at + 2.0


def test_a_late_answer_to_an_older_keepalive_never_shortens_validity() -> None:
    clock = LeaseClock(2.0).renewed(10.0, 2.0).renewed(9.0, 2.0)
    assert clock.valid_until == pytest.approx(10.0 + 2.0 * (1 - LEASE_MARGIN))


def test_lease_gone_from_etcd_ends_validity_at_once() -> None:
    assert not LeaseClock(2.0).renewed(10.0, 2.0).renewed(10.5, 0).valid(10.6)


def test_members_of_the_last_quorum_are_told_to_abandon_its_step_at_a_takeover() -> None:
    notices = takeover_notices((7, frozenset({"a", "b", "c"})), "b", 99)
    assert [(n.kind, n.quorum_id, n.replica_id, n.incarnation) for n in notices] == [
        ("member_lost", 7, "a", 99),
        ("member_lost", 7, "c", 99),
    ]
    assert "its steps cannot commit" in notices[0].reason
    assert takeover_notices((7, frozenset({"a"})), "z", 99) == []
    assert takeover_notices(None, "a", 99) == []
