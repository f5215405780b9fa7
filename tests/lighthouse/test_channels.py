"""Where a client's session goes next (lighthouse/client/channels.py): a table of what happened."""

from __future__ import annotations

import pytest

from lighthouse.client.channels import RECONNECT_INITIAL_S, Reconnect, Targets, parse_addresses
from lighthouse.errors import LighthouseUnavailable, OptionsError

THREE = ("10.0.0.1:29510", "10.0.0.2:29510", "10.0.0.3:29510")


def test_follower_naming_the_leader_sends_the_session_there_at_once() -> None:
    t = Targets(THREE)
    pause = t.after_not_leader("this lighthouse is not the leader (leader: 10.0.0.3:29510)")
    assert t.current == "10.0.0.3:29510" and pause < 0.05


def test_follower_without_a_leader_moves_to_the_next_address() -> None:
    t = Targets(THREE)
    t.after_not_leader("this lighthouse is not the leader (no leader: etcd unavailable for 3.0s)")
    assert t.current == "10.0.0.2:29510"


def test_unreachable_addresses_are_tried_in_turn_and_a_full_round_pauses() -> None:
    t = Targets(THREE)
    assert [t.after_failure(), t.current] == [0.0, THREE[1]]
    assert [t.after_failure(), t.current] == [0.0, THREE[2]]
    assert [t.after_failure(), t.current] == [RECONNECT_INITIAL_S, THREE[0]]
    assert t.after_failure() == 0.0 and t.after_failure() == 0.0 and t.after_failure() == 2 * RECONNECT_INITIAL_S


def test_single_lighthouse_is_waited_for_with_backoff() -> None:
    t = Targets(("127.0.0.1:29510",))
    assert [t.after_failure() for _ in range(3)] == [0.05, 0.1, 0.2]
    assert t.current == "127.0.0.1:29510" and not t.replicated


def test_each_restart_of_the_lighthouse_is_found_with_the_first_pause_again() -> None:
    """A SIGKILLed lighthouse breaks its registered sessions with an error (UNAVAILABLE), not an
    end of stream. Before, that counted as one more failure: the job's n-th restart was found a
    doubling later each time, 0.05 s, 0.1, 0.2, ... up to 1 s after it was back."""
    reconnect = Reconnect(Targets(("127.0.0.1:29510",)), "g0", duplicate_patience_s=5.0)
    broke = LighthouseUnavailable("UNAVAILABLE: Socket closed")
    pauses = [reconnect.after_error(broke, now=float(i), registered=True) for i in range(5)]
    assert pauses == [RECONNECT_INITIAL_S] * 5
    assert reconnect.after_error(broke, now=5.0) == 2 * RECONNECT_INITIAL_S  # not registered: backing off


@pytest.mark.parametrize("text", ["127.0.0.1", "127.0.0.1:0", "a:1,", ":29510", "h:99999", "h:p"])
def test_bad_address_list_named(text: str) -> None:
    with pytest.raises(OptionsError, match="is not host:port"):
        parse_addresses(text)


def test_address_list_parsed() -> None:
    assert parse_addresses(" a:1, b:2 ,c:3") == ("a:1", "b:2", "c:3")


def test_followers_answering_during_an_election_keep_the_pause_short() -> None:
    t = Targets(THREE)
    pauses = []
    for _ in range(10):  # the dead leader refuses, a follower names it again, ...
        pauses.append(t.after_failure())
        pauses.append(t.after_not_leader(f"this lighthouse is not the leader (leader: {THREE[0]})"))
    assert max(pauses) <= RECONNECT_INITIAL_S
