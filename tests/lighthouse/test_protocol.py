"""The wire protocol (lighthouse/wire/protocol.py, fence.py): round trips, and rejection that names the field.

Hostile bytes are built with msgpack directly, as a peer that does not use our encoder
would send them.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lighthouse.errors import ProtocolError, VersionMismatch
from lighthouse.wire.envelope import MAX_DATA_BYTES, MAX_MESSAGE_BYTES, PROTOCOL_VERSION, encode
from lighthouse.wire.fence import FenceRequest, FenceResponse
from lighthouse.wire.protocol import (
    Heartbeat,
    Member,
    Notice,
    Quorum,
    QuorumRequest,
    Register,
    decode_session_request,
)
from lighthouse.wire.replies import QuorumAnswer, QuorumFailed, QuorumUpdate, decode_session_reply


def pack(body: dict[str, Any]) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


VALID: dict[type, dict[str, Any]] = {
    Register: {"replica_id": "g1", "address": "127.0.0.1:1", "world_size": 2, "step": 3, "last_quorum_id": 4},
    Heartbeat: {"step": 3, "progress": 9},
    Notice: {"kind": "member_lost", "quorum_id": 2, "replica_id": "g2", "reason": "gone", "incarnation": 5},
    QuorumRequest: {
        "replica_id": "g1",
        "step": 3,
        "address": "a:1",
        "world_size": 1,
        "timeout_s": 5.0,
        "shrink_only": False,
        "commit_failures": 0,
        "data": {"store": "h:2"},
    },
    Quorum: {
        "quorum_id": 1,
        "incarnation": 2,
        "created_unix_s": 1700000000.5,
        "replica_ids": ["g1", "g2"],
        "addresses": ["a:1", ""],
        "steps": [3, 0],
        "world_sizes": [1, 2],
        "data": [pack({}), pack({"store": "h:2"})],
    },
    FenceRequest: {"replica_id": "g1", "quorum_id": 1, "step": 3},
    FenceResponse: {"ok": True, "reason": ""},
}


def raw(cls: type, **changes: Any) -> bytes:
    """A valid message of ``cls`` with fields changed (``None`` value: field removed)."""
    body = {"v": PROTOCOL_VERSION, **VALID[cls]}
    for name, value in changes.items():
        if value is None:
            body.pop(name)
        else:
            body[name] = value
    return pack(body)


ROUND_TRIPS = [
    Register("g1", "127.0.0.1:5", 8, 100, 41),
    Register("g1", "", 1, 0),
    Register("g1", "127.0.0.1:5", 8, 100, 41, ("g0", "g1", "job.7:rank-0")),
    Heartbeat(7, 1234),
    Heartbeat(7, 1235, healing=True),
    Notice("registered", incarnation=9, replica_id="g1"),
    Notice("member_lost", 3, "g2", "session stream closed", 9),
    Notice("fenced", -1, "g1", "no heartbeat", 9),
    QuorumRequest("g1", 5, "h:1", 4, 2.5, True, 3, {"store": "h:2", "ranks": [1, 2], "blob": b"\x00\xff"}, ask=12),
    Quorum.of(3, 9, 1700000000.25, (Member("a", "h:1", 5, 2, {"k": "v"}), Member("b", "", 0, 1))),
    Quorum.of(4, 9, 0.0, ()),
    FenceRequest("g1", 3, 7),
    FenceResponse(False, "quorum 3 is not current"),
]


@pytest.mark.parametrize("message", ROUND_TRIPS, ids=lambda m: type(m).__name__)
def test_encode_then_decode_round_trips(message: Any) -> None:
    assert type(message).decode(encode(message)) == message


@pytest.mark.parametrize("cls", list(VALID), ids=lambda c: c.__name__)
def test_foreign_encoder_with_valid_fields_accepted(cls: type) -> None:
    message = cls.decode(raw(cls))
    assert encode(message) and type(message) is cls


@given(
    replica_id=st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.:@-]{0,127}", fullmatch=True),
    step=st.integers(0, 2**62),
    timeout_s=st.floats(0, 24 * 3600.0),
    data=st.dictionaries(st.text(max_size=8), st.integers(-(2**63), 2**64 - 1) | st.text(max_size=8), max_size=5),
)
def test_any_valid_quorum_request_round_trips(
    replica_id: str, step: int, timeout_s: float, data: dict[str, Any]
) -> None:
    message = QuorumRequest(replica_id, step, "", 1, timeout_s, data=data)
    assert QuorumRequest.decode(encode(message)) == message


# (message, field, bad value, what the error must say after "<Message>.<field> ")
FIELD_ERRORS = [
    (Register, "replica_id", 7, "is int 7; expected a string"),
    (Register, "replica_id", "", "is empty; a replica id is 1-128 characters of letters, digits"),
    (Register, "replica_id", "x" * 129, "is 129 characters long; a replica id is 1-128 characters"),
    (Register, "replica_id", "g0\nINFO lighthouse: forged", "is 'g0\\nINFO lighthouse: forged'; a replica id is"),
    (Register, "replica_id", "-g0", "is '-g0'; a replica id is"),
    (Register, "replica_id", "../g0", "is '../g0'; a replica id is"),
    (QuorumRequest, "replica_id", "g0\r", "is 'g0\\r'; a replica id is"),
    (Notice, "replica_id", "g 0", "is 'g 0'; a replica id is"),
    (Register, "address", b"bytes", "is bytes b'bytes'; expected a string"),
    (Register, "address", "a" * 257, "is 257 characters long; the limit is 256"),
    (Register, "world_size", 0, "is 0; expected 1 <= world_size <= 65536"),
    (Register, "world_size", 65537, "is 65537; expected 1 <= world_size <= 65536"),
    (Register, "world_size", 2.0, "is float 2.0; expected an integer"),
    (Register, "step", -1, "is -1; expected 0 <= step <="),
    (Register, "step", True, "is bool True; expected an integer"),
    (Register, "step", 2**63, f"is {2**63}; expected 0 <= step <= {2**62}"),
    (Register, "last_quorum_id", -2, "is -2; expected -1 <= last_quorum_id"),
    (Register, "last_quorum_members", "g1", "is str; expected a list"),
    (Register, "last_quorum_members", ["g1", "g1"], "lists 'g1' more than once"),
    (Register, "replica_id", None, "is missing"),
    (Register, "world_size", None, "is missing"),
    (Heartbeat, "step", "3", "is str '3'; expected an integer"),
    (Heartbeat, "progress", -5, "is -5; expected 0 <= progress"),
    (Heartbeat, "progress", None, "is missing"),
    (Heartbeat, "healing", "yes", "is str 'yes'; expected a bool"),
    (Notice, "kind", "exploded", "is 'exploded'; expected one of"),
    (Notice, "kind", 3, "is int 3; expected a string"),
    (Notice, "quorum_id", -2, "is -2; expected -1 <= quorum_id"),
    (Notice, "reason", "r" * 4097, "is 4097 characters long; the limit is 4096"),
    (Notice, "incarnation", -1, "is -1; expected 0 <= incarnation"),
    (QuorumRequest, "step", [1], "is list [1]; expected an integer"),
    (QuorumRequest, "timeout_s", -0.5, "is -0.5; expected 0.0 <= timeout_s <= 86400.0"),
    (QuorumRequest, "timeout_s", math.inf, "is inf; expected 0.0 <= timeout_s"),
    (QuorumRequest, "timeout_s", math.nan, "is nan; expected 0.0 <= timeout_s"),
    (QuorumRequest, "timeout_s", "5", "is str '5'; expected a number"),
    (QuorumRequest, "timeout_s", False, "is bool False; expected a number"),
    (QuorumRequest, "shrink_only", 1, "is int 1; expected a boolean"),
    (QuorumRequest, "commit_failures", -1, "is -1; expected 0 <= commit_failures"),
    (QuorumRequest, "data", [1, 2], "is list; expected a map"),
    (QuorumRequest, "data", {"k": "x" * (MAX_DATA_BYTES + 1)}, f"bytes encoded; the limit is {MAX_DATA_BYTES}"),
    (QuorumRequest, "address", None, "is missing"),
    (Quorum, "quorum_id", -1, "is -1; expected 0 <= quorum_id"),
    (Quorum, "created_unix_s", 1e13, "expected 0.0 <= created_unix_s"),
    (Quorum, "replica_ids", {"a": 1}, "is dict; expected a list"),
    (Quorum, "replica_ids", ["g1", "g1"], "lists 'g1' more than once"),
    (Quorum, "replica_ids", None, "is missing"),
    (Quorum, "steps", [3], "has 1 elements; expected 2, one per member"),
    (Quorum, "data", None, "is missing"),
    (QuorumRequest, "ask", -1, "is -1; expected 0 <= ask"),
    (QuorumRequest, "commit_lease_s", 11.0, "is 11.0; expected 0.0 <= commit_lease_s <= 10.0"),
    (QuorumRequest, "commit_lease_s", math.nan, "is nan; expected 0.0 <= commit_lease_s"),
    (Quorum, "max_commit_lease_s", -0.1, "is -0.1; expected 0.0 <= max_commit_lease_s <= 10.0"),
    (Quorum, "standing_steps", 9, "is 9; expected 0 <= standing_steps <= 8"),
    (Quorum, "standing_steps", -1, "is -1; expected 0 <= standing_steps <= 8"),
    (FenceRequest, "quorum_id", "1", "is str '1'; expected an integer"),
    (FenceRequest, "replica_id", None, "is missing"),
    (FenceResponse, "ok", 1, "is int 1; expected a boolean"),
]


@pytest.mark.parametrize(
    ("cls", "name", "value", "expected"),
    FIELD_ERRORS,
    ids=[f"{c.__name__}.{n}={str(v)[:20]}" for c, n, v, _ in FIELD_ERRORS],
)
def test_bad_field_rejected_naming_message_and_field(cls: type, name: str, value: Any, expected: str) -> None:
    with pytest.raises(ProtocolError) as raised:
        cls.decode(raw(cls, **{name: value}))
    assert not isinstance(raised.value, VersionMismatch)
    assert str(raised.value).startswith(f"{cls.__name__}.{name} "), str(raised.value)
    assert expected in str(raised.value)


@pytest.mark.parametrize(
    ("column", "value", "expected"),
    [
        ("replica_ids", ["g1", 7], "Quorum.replica_ids[1] is int 7; expected a string"),
        ("replica_ids", ["", "g2"], "Quorum.replica_ids[0] is empty; expected a non-empty string"),
        ("replica_ids", ["g1", "x" * 129], "Quorum.replica_ids[1] is 129 characters long; the limit is 128"),
        ("replica_ids", ["g1", "g\x1b[2J"], "Quorum.replica_ids[1] is 'g\\x1b[2J'; a replica id is"),
        ("replica_ids", ["g1\x00g2", "g3"], "Quorum.replica_ids[0] is 'g1\\x00g2'; a replica id is"),
        ("addresses", ["a:1", None], "Quorum.addresses[1] is NoneType None; expected a string"),
        ("steps", [3, -4], "Quorum.steps[1] is -4; expected 0 <= steps[1]"),
        ("steps", [True, 0], "Quorum.steps[0] is bool True; expected an integer"),
        ("world_sizes", [1, 0], "Quorum.world_sizes[1] is 0; expected 1 <= world_sizes[1] <= 65536"),
        ("data", [b"", {}], "Quorum.data[1] is dict; expected bytes (msgpack bin)"),
        ("data", [b"", b"x" * (MAX_DATA_BYTES + 1)], f"Quorum.data[1] is {MAX_DATA_BYTES + 1} bytes; the limit is"),
    ],
)
def test_bad_quorum_column_element_rejected_naming_its_index(column: str, value: Any, expected: str) -> None:
    with pytest.raises(ProtocolError, match="^" + re.escape(expected)):
        Quorum.decode(raw(Quorum, **{column: value}))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (["g1", 7], "Register.last_quorum_members[1] is int 7; expected a string"),
        (["", "g2"], "Register.last_quorum_members[0] is empty; expected a non-empty string"),
        (["g1", "x" * 129], "Register.last_quorum_members[1] is 129 characters long; the limit is 128"),
        (["g1", "g0\nINFO forged"], "Register.last_quorum_members[1] is 'g0\\nINFO forged'; a replica id is"),
    ],
)
def test_bad_last_quorum_member_rejected_naming_its_index(value: Any, expected: str) -> None:
    with pytest.raises(ProtocolError, match="^" + re.escape(expected)):
        Register.decode(raw(Register, last_quorum_members=value))


def test_a_register_without_last_quorum_members_reports_none() -> None:
    """An older client leaves the field out: the restarted lighthouse does not know its last
    quorum's members, and waits for them as it always did (reconnects.py)."""
    assert Register.decode(raw(Register)).last_quorum_members == ()


def test_last_quorum_members_of_a_thousand_groups_fit_the_message_limit() -> None:
    ids = tuple(f"group-{i:04d}-{'x' * 100}" for i in range(1000))
    assert Register.decode(encode(Register("g1", "", 1, 0, 7, ids))).last_quorum_members == ids
    with pytest.raises(ProtocolError, match="^Register is .* bytes; the limit is"):
        Register.decode(raw(Register, last_quorum_members=[f"g{i}-{'x' * 120}" for i in range(40_000)]))


def test_quorum_participants_are_its_columns_as_members() -> None:
    q = Quorum.decode(raw(Quorum))
    assert q.participants == (Member("g1", "a:1", 3, 1, {}), Member("g2", "", 0, 2, {"store": "h:2"}))
    assert q.member("g2") == q.participants[1] and q.member("g3") is None


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"\xc1", "Quorum.data[1] is not valid msgpack"),
        (pack([1, 2]), "Quorum.data[1] is list; expected a map"),
        (pack({b"k": 2}), "Quorum.data[1] has a key b'k'; keys must be strings"),
        (pack({3: "x"}), "Quorum.data[1] is not valid msgpack .*int is not allowed for map key"),
    ],
)
def test_bad_member_data_rejected_naming_its_index_when_the_member_is_built(data: bytes, expected: str) -> None:
    q = Quorum.decode(raw(Quorum, data=[pack({}), data]))
    assert q.member("g1") == Member("g1", "a:1", 3, 1, {})
    for build in (lambda: q.participants, lambda: q.member("g2")):
        with pytest.raises(ProtocolError, match="^" + expected.replace("[", r"\[").replace("]", r"\]")):
            build()


SESSION_REQUESTS = [Heartbeat(7, 1234, leaving=True), QuorumRequest("g1", 5, "h:1", 4, 2.5, ask=3)]
SESSION_REPLIES = [
    Notice("member_lost", 3, "g2", "session stream closed", 9),
    QuorumAnswer(4, encode(Quorum.of(3, 9, 1.0, (Member("a", "h:1", 5, 2),)))),
    QuorumFailed(5, "timeout", "no quorum within 1s"),
    QuorumUpdate(6, 7, 9, 2.0, QuorumUpdate.encode_steps((5, 5, 4))),
    QuorumUpdate(6, 7, 9, 2.0, QuorumUpdate.encode_steps((5, 5)), standing_steps=3),
    Notice("standing_ended", 3, "g1", "'g1' asked for a quorum at step 5 while quorum 3 stood", 9),
]


@pytest.mark.parametrize("message", SESSION_REQUESTS, ids=lambda m: type(m).__name__)
def test_session_request_decoded_by_its_type_tag(message: Any) -> None:
    assert decode_session_request(encode(message)) == message


@pytest.mark.parametrize("message", SESSION_REPLIES, ids=lambda m: type(m).__name__)
def test_session_reply_decoded_by_its_type_tag(message: Any) -> None:
    assert decode_session_reply(encode(message)) == message


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"step": 1, "progress": 2}, "SessionRequest.t is None; expected one of ['heartbeat', 'quorum']"),
        ({"t": "fence", "step": 1}, "SessionRequest.t is 'fence'"),
        ({"t": "heartbeat", "step": -1, "progress": 2}, "Heartbeat.step is -1"),
        ({"t": "quorum", "replica_id": "g1", "step": 1}, "QuorumRequest.address is missing"),
    ],
)
def test_bad_session_request_rejected_naming_the_field(body: dict[str, Any], expected: str) -> None:
    with pytest.raises(ProtocolError, match="^" + expected.replace("[", r"\[").replace("]", r"\]")):
        decode_session_request(pack({"v": PROTOCOL_VERSION, **body}))


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"t": "answer", "ask": 1, "quorum": "not bytes"}, "QuorumAnswer.quorum is str; expected bytes"),
        ({"t": "answer", "ask": 0, "quorum": b""}, "QuorumAnswer.ask is 0; expected 1 <= ask"),
        ({"t": "quorum_failed", "ask": 1, "code": "exploded", "reason": ""}, "QuorumFailed.code is 'exploded'"),
        ({"t": "quorum_failed", "ask": 1, "code": "timeout"}, "QuorumFailed.reason is missing"),
        ({"t": "hello"}, "SessionReply.t is 'hello'; expected one of ['notice', 'answer', 'update', 'quorum_failed']"),
    ],
)
def test_bad_session_reply_rejected_naming_the_field(body: dict[str, Any], expected: str) -> None:
    with pytest.raises(ProtocolError, match="^" + expected.replace("[", r"\[").replace("]", r"\]")):
        decode_session_reply(pack({"v": PROTOCOL_VERSION, **body}))


def test_integer_map_key_anywhere_rejected() -> None:
    # msgpack's strict_map_key refuses it at any depth, before any field is looked at.
    body = {"v": PROTOCOL_VERSION, **VALID[QuorumRequest], "data": {"ranks": [{3: "x"}]}}
    with pytest.raises(ProtocolError, match="^QuorumRequest is not valid msgpack .*int is not allowed for map key"):
        QuorumRequest.decode(pack(body))


@pytest.mark.parametrize("version", [0, 1, 99, "2", None])
def test_other_protocol_version_rejected_naming_both_versions(version: Any) -> None:
    body = {"v": version, **VALID[QuorumRequest]}
    if version is None:
        del body["v"]
    with pytest.raises(VersionMismatch) as raised:
        QuorumRequest.decode(pack(body))
    message = str(raised.value)
    assert message.startswith("QuorumRequest speaks protocol version ")
    assert f"version {version!r}" in message and f"this side speaks version {PROTOCOL_VERSION}" in message
    assert isinstance(raised.value, ProtocolError)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", "not valid msgpack"),
        (b"\xc1", "not valid msgpack"),
        (b"\x92\x01", "not valid msgpack"),  # a 2-array cut short
        (pack({"v": 1}) + b"\x00", "not valid msgpack"),  # trailing bytes
        (pack({1: 2}), "not valid msgpack"),  # strict_map_key
        (pack([1, 2, 3]), "must be a msgpack map, got list"),
        (pack("hello"), "must be a msgpack map, got str"),
        (b"\xff" * 16, "not valid msgpack"),
    ],
)
def test_garbage_bytes_rejected(data: bytes, expected: str) -> None:
    with pytest.raises(ProtocolError, match=expected) as raised:
        Heartbeat.decode(data)
    assert str(raised.value).startswith("Heartbeat ")


def test_oversized_message_rejected_before_parsing() -> None:
    with pytest.raises(ProtocolError, match=f"is {MAX_MESSAGE_BYTES + 1} bytes; the limit is {MAX_MESSAGE_BYTES}"):
        Heartbeat.decode(b"\x00" * (MAX_MESSAGE_BYTES + 1))


def test_non_bytes_rejected() -> None:
    not_bytes: Any = "not bytes"
    with pytest.raises(ProtocolError, match="expected bytes, got str"):
        Heartbeat.decode(not_bytes)


@given(st.binary(max_size=64))
def test_arbitrary_bytes_never_raise_anything_but_protocol_error(data: bytes) -> None:
    for cls in VALID:
        try:
            cls.decode(data)
        except ProtocolError:
            pass


def test_protocol_errors_are_value_errors() -> None:
    assert issubclass(ProtocolError, ValueError) and issubclass(VersionMismatch, ProtocolError)


@pytest.mark.parametrize("kind", [["member_lost"], {"k": 1}, 3])
def test_unhashable_or_non_string_kind_rejected_as_not_a_string(kind: Any) -> None:
    with pytest.raises(ProtocolError, match=r"^Notice\.kind is .*; expected a string"):
        Notice.decode(raw(Notice, kind=kind))


class TestQuorumUpdate:
    """A quorum on an unchanged roster travels as its changes (lighthouse/wire/replies.py)."""

    LAST = Quorum.of(3, 9, 1.0, (Member("a", "h:1", 5, 1, {"r": 1}), Member("b", "h:2", 5, 1), Member("c", "", 4, 2)))

    def test_update_applied_to_the_last_quorum_is_the_new_quorum(self) -> None:
        new = Quorum.of(
            4,
            9,
            2.0,
            (Member("a", "h:1", 6, 1, {"r": 1}), Member("b", "h:2", 6, 1), Member("c", "", 6, 2)),
            standing_steps=2,
        )
        update = QuorumUpdate(1, 4, 9, 2.0, QuorumUpdate.encode_steps(new.steps), standing_steps=2)
        assert update.apply(self.LAST) == new
        assert len(encode(update)) < 100  # every member at one step: one run, whatever the roster

    @pytest.mark.parametrize(
        ("runs", "expected"),
        [
            ([[5, 2]], "covers 2 members; the roster it updates has 3"),
            ([[5, 4]], "QuorumUpdate.steps[0][1] is 4; expected 1 <= steps[0][1] <= 3"),
            ([[5, 2], [-1, 1]], "QuorumUpdate.steps[1][0] is -1"),
            ([[5]], "QuorumUpdate.steps[0] is [5]; expected [step, count]"),
            ({"a": 1}, "QuorumUpdate.steps is dict; expected a list"),
        ],
    )
    def test_update_not_covering_the_roster_rejected(self, runs: Any, expected: str) -> None:
        with pytest.raises(ProtocolError, match=re.escape(expected)):
            QuorumUpdate(1, 4, 9, 2.0, pack(runs)).apply(self.LAST)

    @given(st.lists(st.integers(0, 3), min_size=1, max_size=40))
    def test_run_length_steps_round_trip(self, steps: list[int]) -> None:
        members = tuple(Member(f"g{i}", "", s, 1) for i, s in enumerate(steps))
        last = Quorum.of(1, 1, 1.0, tuple(Member(m.replica_id, "", 0, 1) for m in members))
        update = QuorumUpdate(1, 2, 1, 1.0, QuorumUpdate.encode_steps(tuple(steps)))
        assert update.apply(last).steps == tuple(steps)
