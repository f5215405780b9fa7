"""What the lighthouse sends down a session in reply to a quorum request.

A reply names the request it answers (``ask``). :class:`QuorumAnswer` carries the whole
quorum, encoded once per round and wrapped per member. :class:`QuorumUpdate` carries only
what changed since the last quorum sent on the same session, when its roster (replica ids,
addresses, world sizes, data) did not: the quorum id, the time and the steps. Members need
the roster (where to rendezvous, whom to heal from) but it changes only when membership
does, and sent whole to N members every round it was N x N entries per step, the one cost of
the lighthouse that grew faster than its members (issue 24: 1,024 members of ~30 bytes each
made 31 MB per round). The steps are run-length encoded, as (step, count) pairs in roster
order: in steady training every member is at one step, so an update is a few dozen bytes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import msgpack

from lighthouse.errors import ProtocolError, shown
from lighthouse.rules.standing import MAX_STANDING_STEPS
from lighthouse.wire.envelope import (
    MAX_REASON_CHARS,
    check_choice,
    check_float,
    check_int,
    check_str,
    require,
)
from lighthouse.wire.protocol import Notice, Quorum, decode_tagged


@dataclass(frozen=True, slots=True)
class QuorumAnswer:
    """Down the session stream: the quorum formed for the member's request number ``ask``.

    ``quorum`` is the encoded :class:`Quorum`, the same bytes for every member: the
    lighthouse encodes a quorum once per round and wraps it in this small envelope per
    member. The member validates it with ``Quorum.decode`` when it takes the answer.
    """

    TAG: ClassVar[str] = "answer"
    ask: int
    quorum: bytes

    @classmethod
    def from_map(cls, o: Mapping[str, Any]) -> QuorumAnswer:
        m = "QuorumAnswer"
        quorum = require(o, m, "quorum")
        if not isinstance(quorum, bytes):
            raise ProtocolError(f"QuorumAnswer.quorum is {type(quorum).__name__}; expected bytes (msgpack bin)")
        return cls(ask=check_int(m, "ask", require(o, m, "ask"), 1), quorum=quorum)


FailureCode = Literal["timeout", "aborted", "refused"]
FAILURE_CODES: frozenset[str] = frozenset({"timeout", "aborted", "refused"})


@dataclass(frozen=True, slots=True)
class QuorumFailed:
    """Down the session stream: request ``ask`` ended without a quorum.

    ``timeout``: none formed within the request's ``timeout_s`` (the reason gives the rule's
    counts; the member gives up). ``aborted``: a newer request superseded it or the member
    was declared lost (the member asks again, on a new session if need be). ``refused``: a
    quorum with this member's entry would not fit one message (the reason gives the sizes;
    asking again cannot help).
    """

    TAG: ClassVar[str] = "quorum_failed"
    ask: int
    code: str
    reason: str

    @classmethod
    def from_map(cls, o: Mapping[str, Any]) -> QuorumFailed:
        m = "QuorumFailed"
        return cls(
            ask=check_int(m, "ask", require(o, m, "ask"), 1),
            code=check_choice(m, "code", require(o, m, "code"), FAILURE_CODES),
            reason=check_str(m, "reason", require(o, m, "reason"), MAX_REASON_CHARS, True),
        )


@dataclass(frozen=True, slots=True)
class QuorumUpdate:
    """Down the session stream: request ``ask``'s quorum, as a change to the last one sent on
    this session (same roster). ``steps`` is msgpack bytes of ``[[step, count], ...]``."""

    TAG: ClassVar[str] = "update"
    ask: int
    quorum_id: int
    incarnation: int
    created_unix_s: float
    steps: bytes
    standing_steps: int = 0

    @staticmethod
    def encode_steps(steps: tuple[int, ...]) -> bytes:
        runs: list[list[int]] = []
        for step in steps:
            if runs and runs[-1][0] == step:
                runs[-1][1] += 1
            else:
                runs.append([step, 1])
        return msgpack.packb(runs)

    @classmethod
    def from_map(cls, o: Mapping[str, Any]) -> QuorumUpdate:
        m = "QuorumUpdate"
        steps = require(o, m, "steps")
        if not isinstance(steps, bytes):
            raise ProtocolError(f"QuorumUpdate.steps is {type(steps).__name__}; expected bytes (msgpack bin)")
        return cls(
            ask=check_int(m, "ask", require(o, m, "ask"), 1),
            quorum_id=check_int(m, "quorum_id", require(o, m, "quorum_id"), 0),
            incarnation=check_int(m, "incarnation", require(o, m, "incarnation"), 0),
            created_unix_s=check_float(m, "created_unix_s", require(o, m, "created_unix_s"), 0.0, 1e12),
            steps=steps,
            standing_steps=check_int(m, "standing_steps", o.get("standing_steps", 0), 0, MAX_STANDING_STEPS),
        )

    def apply(self, last: Quorum) -> Quorum:
        """The quorum this update describes, on the roster of ``last``; raises ProtocolError
        if its steps do not cover that roster exactly."""
        try:
            runs = msgpack.unpackb(self.steps, raw=False, strict_map_key=True, use_list=True)
        except Exception as e:  # msgpack raises several unrelated types for bad input
            raise ProtocolError(f"QuorumUpdate.steps is not valid msgpack ({type(e).__name__}: {e})") from e
        if not isinstance(runs, list):
            raise ProtocolError(f"QuorumUpdate.steps is {type(runs).__name__}; expected a list of [step, count]")
        steps: list[int] = []
        for i, run in enumerate(runs):
            if not isinstance(run, list) or len(run) != 2:
                raise ProtocolError(f"QuorumUpdate.steps[{i}] is {shown(run)}; expected [step, count]")
            step = check_int("QuorumUpdate", f"steps[{i}][0]", run[0], 0)
            count = check_int("QuorumUpdate", f"steps[{i}][1]", run[1], 1, len(last.replica_ids) - len(steps))
            steps += [step] * count
        if len(steps) != len(last.replica_ids):
            raise ProtocolError(
                f"QuorumUpdate.steps covers {len(steps)} members; the roster it updates has {len(last.replica_ids)}"
            )
        return dataclasses.replace(
            last,
            quorum_id=self.quorum_id,
            incarnation=self.incarnation,
            created_unix_s=self.created_unix_s,
            steps=tuple(steps),
            standing_steps=self.standing_steps,
        )


def decode_session_reply(raw: bytes) -> Notice | QuorumAnswer | QuorumUpdate | QuorumFailed:
    """A message the lighthouse sends on a session stream, by its ``t`` tag."""
    return decode_tagged(raw, "SessionReply", (Notice, QuorumAnswer, QuorumUpdate, QuorumFailed))
