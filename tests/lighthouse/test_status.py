"""The status page's content (lighthouse/server/status.py), rendered from a bare state machine: the
snapshot reads only :class:`Membership` and the metrics, so no server or socket is needed here.
The served routes are exercised over HTTP in test_lighthouse_server.py."""

from __future__ import annotations

import json

from lighthouse.config.options import MembershipOptions
from lighthouse.rules.membership import Membership
from lighthouse.server.metrics import Metrics
from lighthouse.server.status import render_html, status_snapshot
from lighthouse.wire.protocol import QuorumRequest, Register


def membership_with_quorum() -> Membership:
    m = Membership(MembershipOptions(), incarnation=77)
    for rid in ("a", "<b>"):
        m.register(Register(rid, f"host-{rid}", 2, 5), 0.0)
        m.join(QuorumRequest(rid, 5, f"host-{rid}", 2, 10.0), 0.0)
    assert m.decide(0.0) is not None
    m.register(Register("c", "host-c", 2, 0), 0.0)
    m.join(QuorumRequest("c", 0, "host-c", 2, 10.0), 0.0)
    return m


def test_snapshot_shows_members_quorum_and_waiters() -> None:
    snap = status_snapshot(membership_with_quorum(), Metrics())
    assert snap["incarnation"] == 77
    assert snap["current_quorum"]["participants"] == ["<b>", "a"]
    assert {m["replica_id"]: m["state"] for m in snap["members"]} == {
        "<b>": "in quorum",
        "a": "in quorum",
        "c": "waiting",
    }
    assert snap["history"][0]["path"] == "slow"
    json.dumps(snap)  # served as /status.json as is


def test_page_escapes_replica_ids() -> None:
    page = render_html(status_snapshot(membership_with_quorum(), Metrics()))
    assert "<b>" not in page.replace("<b>1</b>", "")
    assert "&lt;b&gt;" in page


def test_snapshot_before_any_quorum() -> None:
    snap = status_snapshot(Membership(MembershipOptions(), incarnation=1), Metrics())
    assert snap["current_quorum"] is None and snap["members"] == []
    assert snap["next_quorum_reason"] == "no quorum requested yet"
    assert "none yet" in render_html(snap)
