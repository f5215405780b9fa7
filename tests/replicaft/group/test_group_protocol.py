"""The group manager's messages (replicaft/group/protocol.py): round trips and strict decoding."""

from __future__ import annotations

import msgpack
import pytest

from lighthouse.errors import ProtocolError
from lighthouse.wire.envelope import PROTOCOL_VERSION, encode
from replicaft.group.protocol import VoteRequest, VoteResponse


def test_vote_carries_a_leaving_rank_to_the_group_and_back() -> None:
    request = VoteRequest(group_rank=1, step=7, quorum_id=3, ok=True, reason="", timeout_s=5.0, leaving=True)
    assert VoteRequest.decode(encode(request)) == request
    response = VoteResponse(commit=True, reason="", leave=True)
    assert VoteResponse.decode(encode(response)) == response


def test_vote_without_the_leaving_fields_means_nobody_leaves() -> None:
    raw = msgpack.packb({"v": PROTOCOL_VERSION, "group_rank": 0, "step": 1, "quorum_id": 1, "ok": True})
    assert VoteRequest.decode(raw).leaving is False
    assert VoteResponse.decode(msgpack.packb({"v": PROTOCOL_VERSION, "commit": False})).leave is False


@pytest.mark.parametrize(
    ("message", "body", "field"),
    [
        (VoteRequest, {"group_rank": 0, "step": 1, "quorum_id": 1, "ok": True, "leaving": "yes"}, "leaving"),
        (VoteResponse, {"commit": True, "leave": 1}, "leave"),
    ],
)
def test_a_leaving_flag_of_the_wrong_type_is_refused_by_name(message: type, body: dict, field: str) -> None:
    with pytest.raises(ProtocolError, match=field):
        message.decode(msgpack.packb({"v": PROTOCOL_VERSION, **body}))
