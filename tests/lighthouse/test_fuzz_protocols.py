"""Hostile bytes against every control-plane decoder: the lighthouse's messages
(lighthouse/wire/protocol.py, fence.py and replies.py on lighthouse/wire/envelope.py) and the group
manager's (replicaft/group/protocol.py). Issue 19.

The decoders are found, not listed: every class of those modules with a ``decode`` (or a
``TAG`` and ``from_map``, decoded through ``decode_tagged``) is fuzzed, and a message added
without a valid example here fails :func:`test_every_message_type_has_a_valid_example`.
Each must return a message that survives its own round trip or raise ``ProtocolError``.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.fuzz_support import (
    DEEP,
    FUZZ,
    call_decoder,
    damaged_bytes,
    msgpack_values,
    mutated_map,
    nested,
)

import lighthouse.wire.fence
import lighthouse.wire.protocol
import lighthouse.wire.replies
import replicaft.group.protocol
from lighthouse.errors import ProtocolError
from lighthouse.wire.envelope import PROTOCOL_VERSION, encode
from lighthouse.wire.protocol import Member, Notice, Quorum, decode_session_request, decode_tagged
from lighthouse.wire.replies import QuorumAnswer, QuorumUpdate, decode_session_reply

MODULES: tuple[ModuleType, ...] = (
    lighthouse.wire.protocol,
    lighthouse.wire.fence,
    lighthouse.wire.replies,
    replicaft.group.protocol,
)


def _message_types() -> dict[str, type]:
    found = {}
    for module in MODULES:
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if (
                cls.__module__ == module.__name__
                and dataclasses.is_dataclass(cls)
                and (hasattr(cls, "decode") or hasattr(cls, "TAG") and hasattr(cls, "from_map"))
            ):
                found[f"{module.__name__}.{name}"] = cls
    return found


MESSAGES = _message_types()

ROSTER = Quorum.of(7, 1, 1_700_000_000.5, (Member("g0", "h:1", 3, 1, {"store": "h:2"}), Member("g1", "", 3, 2)))
EXAMPLES: dict[type, Any] = {
    lighthouse.wire.protocol.Register: lighthouse.wire.protocol.Register(
        "g0", "127.0.0.1:1", 2, 3, 4, ("g0", "g1"), "inst-1", 0.5
    ),
    lighthouse.wire.protocol.Heartbeat: lighthouse.wire.protocol.Heartbeat(3, 9, False),
    lighthouse.wire.protocol.Notice: Notice("member_lost", 2, "g1", "gone", 5, 0.25),
    lighthouse.wire.protocol.QuorumRequest: lighthouse.wire.protocol.QuorumRequest(
        "g0", 3, "a:1", 1, 5.0, False, 0, {"store": "h:2", "ranks": [1, 2]}, 4
    ),
    lighthouse.wire.protocol.Quorum: ROSTER,
    lighthouse.wire.fence.FenceRequest: lighthouse.wire.fence.FenceRequest("g0", 1, 3),
    lighthouse.wire.fence.FenceResponse: lighthouse.wire.fence.FenceResponse(False, "fenced"),
    lighthouse.wire.replies.QuorumAnswer: QuorumAnswer(4, encode(ROSTER)),
    lighthouse.wire.replies.QuorumFailed: lighthouse.wire.replies.QuorumFailed(4, "timeout", "1 of 2 members"),
    lighthouse.wire.replies.QuorumUpdate: QuorumUpdate(4, 8, 1, 1_700_000_001.0, QuorumUpdate.encode_steps((4, 3))),
    replicaft.group.protocol.GroupQuorumRequest: replicaft.group.protocol.GroupQuorumRequest(
        1, 3, 5.0, 0, {"store": "h:2"}
    ),
    replicaft.group.protocol.VoteRequest: replicaft.group.protocol.VoteRequest(1, 3, 7, True, "", 10.0, False),
    replicaft.group.protocol.VoteResponse: replicaft.group.protocol.VoteResponse(True, "ok", False),
    replicaft.group.protocol.WatchRequest: replicaft.group.protocol.WatchRequest(2),
}


def decoder_of(cls: type) -> Callable[[bytes], Any]:
    """Everything a receiver does with the bytes of a ``cls``: decode, and for a quorum also
    decode each member's data (``participants``) and apply an update to the last roster."""
    if cls is Quorum:

        def decode_quorum(raw: bytes) -> Quorum:
            quorum = Quorum.decode(raw)
            quorum.participants  # noqa: B018 (decodes every member's data map)
            return quorum

        return decode_quorum
    if cls is QuorumUpdate:

        def decode_update(raw: bytes) -> QuorumUpdate:
            update = decode_tagged(raw, "SessionReply", (QuorumUpdate,))
            update.apply(ROSTER)
            return update

        return decode_update
    if hasattr(cls, "decode"):
        return cls.decode
    return lambda raw: decode_tagged(raw, "SessionReply", (cls,))


def body_of(message: Any) -> dict[str, Any]:
    return msgpack.unpackb(encode(message), raw=False)


def check(cls: type, raw: bytes) -> None:
    """The decoder's contract on ``raw``; a message it accepts must round-trip unchanged
    (compared encoded: an opaque ``data`` map may carry a NaN, which is not equal to itself)."""
    message = call_decoder(lambda: decoder_of(cls)(raw), ProtocolError, cls.__name__, len(raw))
    if message is not None:
        assert type(message) is cls
        assert encode(decoder_of(cls)(encode(message))) == encode(message)


def test_every_message_type_has_a_valid_example() -> None:
    assert set(MESSAGES.values()) == set(EXAMPLES), "a new message type needs an example in EXAMPLES"


@pytest.mark.parametrize("cls", EXAMPLES, ids=lambda c: c.__name__)
def test_valid_example_round_trips(cls: type) -> None:
    assert decoder_of(cls)(encode(EXAMPLES[cls])) == EXAMPLES[cls]


@pytest.mark.parametrize("cls", EXAMPLES, ids=lambda c: c.__name__)
@FUZZ
@given(data=st.data())
def test_random_bytes_decode_or_raise_protocol_error(cls: type, data: st.DataObject) -> None:
    raw = data.draw(
        st.one_of(
            st.binary(max_size=200),
            msgpack_values.map(lambda v: msgpack.packb(v, use_bin_type=True)),
            st.dictionaries(st.text(max_size=8), msgpack_values, max_size=6).map(
                lambda d: msgpack.packb({**d, "v": PROTOCOL_VERSION}, use_bin_type=True)
            ),
            damaged_bytes(encode(EXAMPLES[cls])),
        )
    )
    check(cls, raw)


@pytest.mark.parametrize("cls", EXAMPLES, ids=lambda c: c.__name__)
@FUZZ
@given(data=st.data())
def test_one_hostile_field_decodes_or_raises_protocol_error(cls: type, data: st.DataObject) -> None:
    body = data.draw(mutated_map(body_of(EXAMPLES[cls]), protected=frozenset({"v", "t"})))
    check(cls, msgpack.packb(body, use_bin_type=True))


@FUZZ
@given(data=st.data())
def test_session_streams_dispatch_any_tag_or_raise_protocol_error(data: st.DataObject) -> None:
    """The dispatchers by ``t`` tag, fed any message of either direction with a hostile field."""
    cls = data.draw(st.sampled_from([c for c in EXAMPLES if hasattr(c, "TAG")]))
    body = data.draw(mutated_map(body_of(EXAMPLES[cls]), protected=frozenset({"v"})))
    raw = msgpack.packb(body, use_bin_type=True)
    call_decoder(lambda: decode_session_request(raw), ProtocolError, "decode_session_request", len(raw))
    call_decoder(lambda: decode_session_reply(raw), ProtocolError, "decode_session_reply", len(raw))


# -- regression tests for what the fuzzing found (issue 19) -------------------------------------


def test_field_nested_past_repr_depth_is_a_protocol_error_not_recursion_error_issue_19() -> None:
    raw = msgpack.packb({"v": PROTOCOL_VERSION, "step": nested(DEEP), "progress": 0})
    with pytest.raises(ProtocolError, match=r"Heartbeat.step is list \[\[\[\[\.\.\.\]\]\]\]; expected an integer"):
        lighthouse.wire.protocol.Heartbeat.decode(raw)


@pytest.mark.parametrize("field", ["step", "replica_id", "timeout_s", "shrink_only", "t"])
def test_error_shows_a_megabyte_value_in_a_short_message_issue_19(field: str) -> None:
    """The message is logged and sent back as the gRPC status, whose metadata is capped at 8 KiB."""
    body = {**body_of(EXAMPLES[lighthouse.wire.protocol.QuorumRequest]), field: "x" * 1_000_000}
    with pytest.raises(ProtocolError) as info:
        decode_session_request(msgpack.packb(body))
    assert f".{field} is " in str(info.value) and len(str(info.value)) < 400
