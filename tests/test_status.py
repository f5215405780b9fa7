"""The status page's content (lighthouse/status.py), rendered from a server that is built but
not started: the snapshot reads only the state machine, so no socket is needed here.
The served routes are exercised over HTTP in test_lighthouse_server.py."""

from __future__ import annotations

import json

from lighthouse.options import LighthouseOptions
from lighthouse.protocol import QuorumRequest, Register
from lighthouse.server import LighthouseServer
from lighthouse.status import render_html, status_snapshot


def server_with_quorum() -> LighthouseServer:
    server = LighthouseServer(LighthouseOptions(port=0), incarnation=77)
    m = server.membership
    for rid in ("a", "<b>"):
        m.register(Register(rid, f"host-{rid}", 2, 5), 0.0)
        m.join(QuorumRequest(rid, 5, f"host-{rid}", 2, 10.0), 0.0)
    assert m.decide(0.0) is not None
    m.register(Register("c", "host-c", 2, 0), 0.0)
    m.join(QuorumRequest("c", 0, "host-c", 2, 10.0), 0.0)
    return server


def test_snapshot_shows_members_quorum_and_waiters() -> None:
    snap = status_snapshot(server_with_quorum())
    assert snap["incarnation"] == 77
    assert snap["current_quorum"]["participants"] == ["<b>", "a"]
    assert {m["replica_id"]: m["state"] for m in snap["members"]} == {
        "<b>": "in quorum", "a": "in quorum", "c": "waiting",
    }
    assert snap["history"][0]["path"] == "slow"
    json.dumps(snap)  # served as /status.json as is


def test_page_escapes_replica_ids() -> None:
    page = render_html(status_snapshot(server_with_quorum()))
    assert "<b>" not in page.replace("<b>1</b>", "")
    assert "&lt;b&gt;" in page


def test_snapshot_before_any_quorum() -> None:
    snap = status_snapshot(LighthouseServer(LighthouseOptions(port=0)))
    assert snap["current_quorum"] is None and snap["members"] == []
    assert snap["next_quorum_reason"] == "no quorum requested yet"
    assert "none yet" in render_html(snap)
