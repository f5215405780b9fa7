"""The lighthouse as it runs in production: a real server process, real member processes.

Each test starts ``python -m lighthouse`` (tests/conftest.py: ``start_lighthouse``) and
stand-in replica groups (tests/support/lighthouse_member.py) that print what they observe as JSON
lines; failures are injected with real signals, and every wait is for an observable event
with a deadline. Hostile calls go through grpc directly with raw bytes.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
import urllib.error
import urllib.request
from typing import Any

import grpc
import msgpack
import pytest
from conftest import (
    LighthouseProcess,
    ManagedProcess,
    spawn_python,
    start_lighthouse,
    stop_gracefully,
)
from support.member_events import EVENT_TIMEOUT_S, MEMBER_SCRIPT, wait_notice, wait_quorum

from lighthouse import LighthouseUnavailable, QuorumTimeout
from lighthouse.client.async_client import AsyncLighthouseClient
from lighthouse.wire import envelope, protocol, replies
from lighthouse.wire.protocol import Notice

pytestmark = pytest.mark.timeout(60)


def start_member(lighthouse: LighthouseProcess, replica_id: str, *args: str) -> ManagedProcess:
    """A stand-in replica group process joining quorums of ``lighthouse`` in a loop."""
    return spawn_python(MEMBER_SCRIPT, lighthouse.grpc_address, replica_id, *args, name=f"member-{replica_id}")


def start_group(lighthouse: LighthouseProcess, replica_ids: list[str], *args: str) -> dict[str, ManagedProcess]:
    """Start members and wait until each has seen a quorum of all of them."""
    members = {rid: start_member(lighthouse, rid, *args) for rid in replica_ids}
    for member in members.values():
        wait_quorum(member, sorted(replica_ids))
    return members


def quorum_ids(member: ManagedProcess) -> list[int]:
    return [o["quorum_id"] for o in member.json_lines() if o["event"] == "quorum"]


def fetch(url: str, *, method: str = "GET") -> tuple[int, str, str]:
    """(status, content type, body) of an HTTP request made from the test process."""
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5.0) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


def encode_raw(body: dict[str, Any]) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def valid_quorum_request(**overrides: Any) -> dict[str, Any]:
    body = {
        "v": envelope.PROTOCOL_VERSION,
        "replica_id": "intruder",
        "step": 0,
        "address": "",
        "world_size": 1,
        "timeout_s": 1.0,
    }
    body.update(overrides)
    return body


class TestQuorumFormation:
    def test_three_members_form_one_quorum(self) -> None:
        lighthouse = start_lighthouse()
        members = start_group(lighthouse, ["a", "b", "c"])

        seen = {rid: wait_quorum(m, ["a", "b", "c"])[1] for rid, m in members.items()}
        assert len({q["quorum_id"] for q in seen.values()}) == 1, seen
        for rid, member in members.items():
            _, fence = member.wait_for_json(
                lambda o, q=seen[rid]: o["event"] == "fence" and o["quorum_id"] == q["quorum_id"],
                EVENT_TIMEOUT_S,
                what="the fence verdict on its quorum",
            )
            assert fence["ok"], fence

    def test_member_below_min_replicas_times_out_with_the_reason_then_forms_when_peer_arrives(self) -> None:
        lighthouse = start_lighthouse("--min-replicas", "2", status=False)
        a = start_member(lighthouse, "a", "--quorum-timeout-s", "0.3")
        _, timeout = a.wait_for_json(lambda o: o["event"] == "error", EVENT_TIMEOUT_S, what="a quorum timeout")
        assert timeout["error"] == "QuorumTimeout"
        assert "no quorum with 'a' formed within" in timeout["detail"]
        assert "1 waiting is below min_replicas=2" in timeout["detail"]

        b = start_member(lighthouse, "b")
        wait_quorum(a, ["a", "b"])
        wait_quorum(b, ["a", "b"])

    def test_sigkilled_member_reported_at_once_and_quorum_forms_without_it(self) -> None:
        # A 30 s heartbeat timeout: anything that happens within a few seconds was caused by
        # the broken session stream, not by heartbeat expiry.
        lighthouse = start_lighthouse("--heartbeat-timeout", "30", "--progress-timeout", "60")
        members = start_group(lighthouse, ["a", "b", "c"])
        marks = {rid: m.mark() for rid, m in members.items()}
        _, before = wait_quorum(members["a"], ["a", "b", "c"])

        killed_at = time.monotonic()
        members["c"].kill()

        for rid in ("a", "b"):
            notice = wait_notice(members[rid], "member_lost", "c", after=marks[rid])
            latency_s = notice["t"] - killed_at
            print(f"member_lost notice reached {rid} {latency_s * 1000:.1f} ms after SIGKILL")
            assert latency_s < 1.0, notice
            assert "session stream closed" in notice["reason"], notice
            formed_at, after = wait_quorum(members[rid], ["a", "b"], after=marks[rid])
            assert formed_at - killed_at < 5.0
            assert after["quorum_id"] > before["quorum_id"]

    def test_lighthouse_restart_members_reconnect_and_quorum_ids_keep_increasing(self) -> None:
        lighthouse = start_lighthouse("--min-replicas", "2", status=False)
        members = start_group(lighthouse, ["a", "b"])
        _, old = wait_quorum(members["a"], ["a", "b"], after=members["a"].mark())
        lighthouse.process.kill()
        marks = {rid: m.mark() for rid, m in members.items()}
        max_old_id = max(max(quorum_ids(m)) for m in members.values())

        restarted = start_lighthouse("--min-replicas", "2", port=lighthouse.port, status=False)

        for rid, member in members.items():
            _, new = member.wait_for_json(
                lambda o: o["event"] == "quorum" and o["incarnation"] != old["incarnation"],
                EVENT_TIMEOUT_S,
                after=marks[rid],
                what="a quorum from the restarted lighthouse",
            )
            assert new["participants"] == ["a", "b"]
            assert new["quorum_id"] > max_old_id, (new, max_old_id)
            assert new["session_epoch"] >= 2, "the member should have opened a new session"
            ids = quorum_ids(member)
            assert ids == sorted(ids), f"quorum ids went backwards at {rid}: {ids}"
        assert restarted.popen.poll() is None

    def restart_after_sigkill(
        self, join_timeout_s: float, also_killed: str | None = None
    ) -> tuple[dict[str, ManagedProcess], dict[str, int], dict[str, Any], float]:
        """Groups a, b, c train on a lighthouse that is SIGKILLed (and ``also_killed`` with it)
        and restarted on its port: (members, marks, last quorum before, monotonic restart time)."""
        args = ("--min-replicas", "2", "--join-timeout", f"{join_timeout_s:g}")
        lighthouse = start_lighthouse(*args, status=False)
        members = start_group(lighthouse, ["a", "b", "c"])
        _, old = wait_quorum(members["a"], ["a", "b", "c"], after=members["a"].mark())
        lighthouse.process.kill()
        if also_killed is not None:
            members.pop(also_killed).kill()
        marks = {rid: m.mark() for rid, m in members.items()}
        restarted_at = time.monotonic()
        start_lighthouse(*args, port=lighthouse.port, status=False)
        return members, marks, old, restarted_at

    def test_restarted_lighthouse_forms_its_first_quorum_once_the_last_quorums_members_are_back(self) -> None:
        """Each member reports the last quorum's members when it registers again: once all are
        back and asking, the first quorum forms, not a join timeout later. A 60 s join timeout
        here, so a quorum within the event deadline shows that nothing waited for it."""
        members, marks, old, _ = self.restart_after_sigkill(join_timeout_s=60.0)
        for rid, member in members.items():
            _, first = member.wait_for_json(
                lambda o: o["event"] == "quorum" and o["incarnation"] != old["incarnation"],
                EVENT_TIMEOUT_S,
                after=marks[rid],
                what="the restarted lighthouse's first quorum, well within its 60 s join timeout",
            )
            assert first["participants"] == ["a", "b", "c"], first
            assert first["quorum_id"] > old["quorum_id"]

    def test_restarted_lighthouse_waits_the_join_timeout_for_a_member_of_the_last_quorum_that_is_gone(
        self,
    ) -> None:
        join_timeout_s = 2.0
        members, marks, old, restarted_at = self.restart_after_sigkill(join_timeout_s, also_killed="c")
        for rid, member in members.items():
            _, first = member.wait_for_json(
                lambda o: o["event"] == "quorum" and o["incarnation"] != old["incarnation"],
                EVENT_TIMEOUT_S + join_timeout_s,
                after=marks[rid],
                what="the restarted lighthouse's first quorum, without c",
            )
            assert first["participants"] == ["a", "b"], first
            assert first["t"] - restarted_at >= join_timeout_s, "it did not wait for c, of the last quorum"


class TestHostileCalls:
    TOKEN = "s3cret-token"

    def call(self, channel: grpc.Channel, method: str, body: bytes, token: str | None = TOKEN) -> grpc.RpcError:
        metadata = () if token is None else (("x-replicaft-token", token),)
        with pytest.raises(grpc.RpcError) as raised:
            channel.unary_unary(method)(body, timeout=5.0, metadata=metadata)
        return raised.value

    def test_malformed_and_unauthenticated_calls_rejected_while_members_keep_working(self) -> None:
        lighthouse = start_lighthouse("--token", self.TOKEN)
        members = start_group(lighthouse, ["a", "b"], "--token", self.TOKEN)
        marks = {rid: m.mark() for rid, m in members.items()}

        quorum, fence = protocol.QUORUM_METHOD, protocol.FENCE_METHOD
        cases = [
            # (method, body, token, expected code, substrings of the details)
            (
                quorum,
                b"\xc1\x00garbage",
                self.TOKEN,
                grpc.StatusCode.INVALID_ARGUMENT,
                ["QuorumRequest", "not valid msgpack"],
            ),
            (
                quorum,
                encode_raw(valid_quorum_request(step="7")),
                self.TOKEN,
                grpc.StatusCode.INVALID_ARGUMENT,
                ["QuorumRequest.step", "str"],
            ),
            (
                quorum,
                encode_raw(valid_quorum_request(world_size=0)),
                self.TOKEN,
                grpc.StatusCode.INVALID_ARGUMENT,
                ["QuorumRequest.world_size", "0"],
            ),
            (
                quorum,
                encode_raw(valid_quorum_request(replica_id="x" * 500)),
                self.TOKEN,
                grpc.StatusCode.INVALID_ARGUMENT,
                ["QuorumRequest.replica_id", "500"],
            ),
            (
                fence,
                encode_raw({"v": envelope.PROTOCOL_VERSION, "replica_id": "a", "quorum_id": -3, "step": 0}),
                self.TOKEN,
                grpc.StatusCode.INVALID_ARGUMENT,
                ["FenceRequest.quorum_id", "-3"],
            ),
            (
                quorum,
                encode_raw(valid_quorum_request(v=99)),
                self.TOKEN,
                grpc.StatusCode.FAILED_PRECONDITION,
                ["version 99", f"version {envelope.PROTOCOL_VERSION}"],
            ),
            (
                quorum,
                encode_raw(valid_quorum_request()),
                None,
                grpc.StatusCode.UNAUTHENTICATED,
                ["missing x-replicaft-token"],
            ),
            (
                quorum,
                encode_raw(valid_quorum_request()),
                "wrong",
                grpc.StatusCode.UNAUTHENTICATED,
                ["wrong x-replicaft-token"],
            ),
            (
                fence,
                encode_raw({"v": envelope.PROTOCOL_VERSION, "replica_id": "a", "quorum_id": 1, "step": 0}),
                "wrong",
                grpc.StatusCode.UNAUTHENTICATED,
                ["wrong"],
            ),
        ]
        with grpc.insecure_channel(lighthouse.grpc_address) as channel:
            for method, body, token, code, substrings in cases:
                error = self.call(channel, method, body, token)
                assert error.code() == code, (method, body[:40], error.details())
                for text in substrings:
                    assert text in error.details(), (text, error.details())

            session = channel.stream_stream(protocol.SESSION_METHOD)
            responses = session(
                iter(
                    [
                        encode_raw(
                            {
                                "v": envelope.PROTOCOL_VERSION,
                                "replica_id": "intruder",
                                "address": "",
                                "world_size": True,
                                "step": 0,
                            }
                        )
                    ]
                ),
                timeout=5.0,
                metadata=(("x-replicaft-token", self.TOKEN),),
            )
            with pytest.raises(grpc.RpcError) as raised:
                list(responses)
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "Register.world_size" in raised.value.details()

        # The members never noticed: no loss, and quorums kept forming after the attacks.
        for rid, member in members.items():
            wait_quorum(member, ["a", "b"], after=member.mark())
            lost = [
                o
                for o in member.json_lines(after=marks[rid])
                if o["event"] == "notice" and o["kind"] != "quorum_formed"
            ]
            assert lost == [], lost
        assert lighthouse.status_url is not None
        _, _, metrics = fetch(lighthouse.status_url + "metrics")
        assert f"replicaft_lighthouse_rejected_requests_total {len(cases) + 1}" in metrics

    def test_member_with_wrong_token_fails_with_unauthenticated(self) -> None:
        lighthouse = start_lighthouse("--token", self.TOKEN, status=False)
        member = start_member(lighthouse, "a", "--token", "not-the-token")
        _, fatal = member.wait_for_json(lambda o: o["event"] == "fatal", EVENT_TIMEOUT_S, what="a fatal error")
        assert fatal["error"] == "Unauthenticated"
        assert "wrong x-replicaft-token" in fatal["detail"]
        assert member.wait_exit(EVENT_TIMEOUT_S) == 3


class TestHungMember:
    def test_sigstopped_member_dropped_after_its_own_cadence_not_the_heartbeat_timeout_and_rejoins(self) -> None:
        """Its session falls silent while the TCP connection stays open: it is lost once the
        silence exceeds ~3x its longest gap between messages (0.1 s heartbeats, 0.05 s steps),
        far below the 5 s heartbeat timeout (issue 20: a SIGSTOP cost survivors 2.64 s)."""
        heartbeat_timeout_s = 5.0
        lighthouse = start_lighthouse(
            "--heartbeat-timeout", str(heartbeat_timeout_s), "--progress-timeout", "30", status=False
        )
        members = start_group(lighthouse, ["a", "b", "c"])
        # The limit adapts once the lighthouse has seen 8 gaps of c's; until then it is the ceiling.
        members["c"].wait_for_json(
            lambda o: o["event"] == "quorum" and o["step"] >= 10, EVENT_TIMEOUT_S, what="ten committed steps"
        )
        marks = {rid: m.mark() for rid, m in members.items()}

        stopped_at = time.monotonic()
        members["c"].send_signal(signal.SIGSTOP)
        try:
            notice = wait_notice(members["a"], "member_lost", "c", after=marks["a"])
            wait_notice(members["b"], "member_lost", "c", after=marks["b"])
            assert notice["t"] - stopped_at < heartbeat_timeout_s / 2, notice["reason"]
            assert "silent for" in notice["reason"] and "beyond its limit" in notice["reason"], notice
            without_c = [wait_quorum(members[rid], ["a", "b"], after=marks[rid])[1] for rid in ("a", "b")]
            resumed_mark = members["a"].mark()
        finally:
            members["c"].send_signal(signal.SIGCONT)

        wait_notice(members["c"], "fenced", "c", after=marks["c"])
        _, rejoined = members["c"].wait_for_json(
            lambda o: o["event"] == "quorum" and o["participants"] == ["a", "b", "c"] and o["session_epoch"] == 2,
            EVENT_TIMEOUT_S,
            after=marks["c"],
            what="a quorum with all three in its second session",
        )
        wait_quorum(members["a"], ["a", "b", "c"], after=resumed_mark)
        assert rejoined["quorum_id"] > max(q["quorum_id"] for q in without_c)


class TestIdentity:
    def test_second_process_with_a_live_replica_id_refused_loudly_while_the_first_trains_on(self) -> None:
        """Issue 19: two processes with one replica id fenced each other ~15 times a second,
        forever, and nothing said so. Now the second is refused with a clear error and exits;
        the lighthouse logs it and counts it; the first is never fenced."""
        lighthouse = start_lighthouse(status=True)
        first = start_member(lighthouse, "a")
        wait_quorum(first, ["a"])
        mark = first.mark()

        second = start_member(lighthouse, "a", "--duplicate-patience-s", "0.5")
        _, fatal = second.wait_for_json(lambda o: o["event"] == "fatal", EVENT_TIMEOUT_S, what="a fatal error")
        assert fatal["error"] == "DuplicateReplica", fatal
        assert "replica id 'a' is already held by a live session" in fatal["detail"], fatal
        assert "give each replica group its own REPLICAFT_REPLICA_ID" in fatal["detail"], fatal
        assert second.wait_exit(EVENT_TIMEOUT_S) == 3
        lighthouse.process.wait_for_line(
            lambda t: "refused a second process for replica a" in t,
            EVENT_TIMEOUT_S,
            what="the lighthouse's error line",
            stream="stderr",
        )
        assert lighthouse.status_url is not None
        _, _, metrics = fetch(lighthouse.status_url + "metrics")
        refused = re.search(r"^replicaft_lighthouse_duplicate_replicas_refused_total ([\d.]+)$", metrics, re.M)
        assert refused is not None and float(refused.group(1)) >= 1, metrics  # once per retry (prometheus: "5.0")
        wait_quorum(first, ["a"], after=first.mark())
        assert not any(o["event"] == "notice" and o["kind"] == "fenced" for o in first.json_lines(after=mark))

    def test_restarted_group_takes_over_its_replica_id(self) -> None:
        lighthouse = start_lighthouse(status=False)
        first = start_member(lighthouse, "a")
        wait_quorum(first, ["a"])
        first.kill()  # the old incarnation of the group is gone, as after a real restart
        second = start_member(lighthouse, "a")
        wait_quorum(second, ["a"])


class TestResourceBounds:
    def test_member_that_never_reads_its_session_is_ended_and_reported_lost(self) -> None:
        """Issue 19: the per-session outbox was unbounded, so a member that never read grew the
        lighthouse's memory. Here it asks for quorums (16 KiB answers) and reads nothing."""
        lighthouse = start_lighthouse(status=False)

        async def never_read() -> grpc.StatusCode:
            async with grpc.aio.insecure_channel(lighthouse.grpc_address) as channel:
                call = await open_raw_session(channel, "hog", timeout_s=60.0)
                pad = "x" * (protocol.MAX_DATA_BYTES - 64)
                for ask in range(1, 4000):
                    # New data every time: a new roster, so every answer is a whole 16 KiB quorum.
                    request = protocol.QuorumRequest("hog", 0, "", 1, 5.0, data={"pad": pad, "n": ask}, ask=ask)
                    try:
                        # Once the lighthouse has cancelled the stream, a write neither fails nor ends.
                        await asyncio.wait_for(call.write(envelope.encode(request)), 2.0)
                    except (grpc.aio.AioRpcError, asyncio.InvalidStateError, asyncio.TimeoutError):
                        break
                return await asyncio.wait_for(call.code(), EVENT_TIMEOUT_S)

        assert asyncio.run(never_read()) == grpc.StatusCode.CANCELLED
        line = lighthouse.process.wait_for_line(
            lambda t: "member hog lost" in t, EVENT_TIMEOUT_S, what="the hog's loss", stream="stderr"
        )
        assert "not reading its session stream: 1024 messages" in line.text, line.text
        member = start_member(lighthouse, "after")  # the lighthouse serves on
        wait_quorum(member, ["after"])


class TestStartup:
    def test_unresolvable_host_says_it_could_not_resolve(self) -> None:
        process = spawn_python("-m", "lighthouse", "--host", "no-such-host.invalid", "--port", "0", name="lighthouse")
        line = process.wait_for_line(lambda t: "error" in t, EVENT_TIMEOUT_S, what="its error", stream="stderr")
        assert "could not resolve --host 'no-such-host.invalid'" in line.text, line.text
        assert "address in use" not in line.text.lower()
        assert process.wait_exit(EVENT_TIMEOUT_S) == 2

    def test_port_in_use_says_so(self) -> None:
        lighthouse = start_lighthouse(status=False)
        process = spawn_python("-m", "lighthouse", "--port", str(lighthouse.port), name="second-lighthouse")
        line = process.wait_for_line(lambda t: "error" in t, EVENT_TIMEOUT_S, what="its error", stream="stderr")
        assert f"could not bind 127.0.0.1:{lighthouse.port} (Address already in use)" in line.text, line.text
        assert process.wait_exit(EVENT_TIMEOUT_S) == 2


class TestStatusPage:
    def test_status_page_json_and_metrics_describe_the_quorum(self) -> None:
        lighthouse = start_lighthouse("--min-replicas", "2", "--join-timeout", "3")
        members = start_group(lighthouse, ["a", "b"])
        _, seen = wait_quorum(members["a"], ["a", "b"], after=members["a"].mark())
        assert lighthouse.status_url is not None

        code, ctype, page = fetch(lighthouse.status_url)
        assert (code, ctype.split(";")[0]) == (200, "text/html")
        assert "replicaft lighthouse" in page and "<td>a</td>" in page and "<td>b</td>" in page

        code, ctype, body = fetch(lighthouse.status_url + "status.json")
        assert (code, ctype.split(";")[0]) == (200, "application/json")
        status = json.loads(body)
        assert status["options"]["min_replicas"] == 2
        assert status["options"]["join_timeout_s"] == 3.0
        assert [m["replica_id"] for m in status["members"]] == ["a", "b"]
        assert status["current_quorum"]["participants"] == ["a", "b"]
        assert status["current_quorum"]["quorum_id"] >= seen["quorum_id"]
        assert status["incarnation"] == seen["incarnation"]

        code, _, metrics = fetch(lighthouse.status_url + "metrics")
        assert code == 200
        values = {
            line.split()[0]: float(line.split()[1])
            for line in metrics.splitlines()
            if line and not line.startswith("#")
        }
        assert values["replicaft_lighthouse_sessions_open"] == 2
        assert values["replicaft_lighthouse_quorums_formed_total"] >= 1
        assert values['replicaft_lighthouse_quorum_latency_seconds_bucket{le="+Inf"}'] >= 1

        assert fetch(lighthouse.status_url + "nope")[0] == 404
        assert fetch(lighthouse.status_url, method="POST")[0] == 405


class TestCommandLine:
    @pytest.mark.parametrize(
        ("args", "expected"),
        [
            (["--min-replicas", "0"], "min_replicas=0"),
            (["--port", "70000"], "port=70000"),
            (["--status-port", "-1"], "status_port=-1"),
            (["--heartbeat-timeout", "5", "--progress-timeout", "2"], "progress_timeout_s=2.0"),
            (["--join-timeout", "0"], "join_timeout_s=0.0"),
            (["--token", ""], "token is empty"),
        ],
    )
    def test_bad_option_prints_one_line_and_exits_2(self, args: list[str], expected: str) -> None:
        process = spawn_python("-m", "lighthouse", *args, name="lighthouse-bad-args")
        assert process.wait_exit(EVENT_TIMEOUT_S) == 2
        errors = [line.text for line in process.lines("stderr")]
        assert len(errors) == 1, errors
        assert errors[0].startswith("replicaft-lighthouse: error: ") and expected in errors[0], errors

    def test_unparsable_argument_exits_2(self) -> None:
        process = spawn_python("-m", "lighthouse", "--port", "many", name="lighthouse-bad-args")
        assert process.wait_exit(EVENT_TIMEOUT_S) == 2
        assert "invalid int value: 'many'" in process.lines("stderr")[-1].text

    def test_port_in_use_exits_2_naming_the_port(self) -> None:
        first = start_lighthouse(status=False)
        second = spawn_python("-m", "lighthouse", "--port", str(first.port), name="lighthouse-second")
        assert second.wait_exit(EVENT_TIMEOUT_S) == 2
        last = second.lines("stderr")[-1].text
        assert last.startswith("replicaft-lighthouse: error: ") and f":{first.port}" in last, last

    def test_sigterm_shuts_down_cleanly_with_members_connected(self) -> None:
        lighthouse = start_lighthouse()
        start_group(lighthouse, ["a", "b"])
        assert stop_gracefully(lighthouse.process) == 0
        assert lighthouse.process.lines()[-1].text == "lighthouse stopped"

    def test_sigterm_right_after_start_exits_0(self) -> None:
        lighthouse = start_lighthouse(status=False)
        assert stop_gracefully(lighthouse.process) == 0


# Runs the CLI like ``python -m lighthouse`` and, at exit, reports every torch module loaded.
_TORCH_PROBE = """
import atexit, json, runpy, sys
def report():
    loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
    print(json.dumps({"event": "modules", "torch": loaded, "lighthouse": "lighthouse.server.grpc_server" in
    sys.modules}), flush=True)
atexit.register(report)
sys.argv = ["lighthouse", *sys.argv[1:]]
runpy.run_module("lighthouse", run_name="__main__", alter_sys=True)
"""


class TestTorchFree:
    def test_import_lighthouse_does_not_import_torch(self) -> None:
        process = spawn_python(
            "-c",
            "import sys, lighthouse, lighthouse.__main__, lighthouse.server.status, lighthouse.rules.plan;"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))",
            name="import-lighthouse",
        )
        assert process.wait_exit(EVENT_TIMEOUT_S) == 0, process.output_tail()
        assert process.lines()[-1].text == "[]"

    def test_serving_quorums_does_not_import_torch(self) -> None:
        lighthouse = start_lighthouse(python_args=("-c", _TORCH_PROBE))
        start_group(lighthouse, ["a", "b"])
        assert lighthouse.status_url is not None
        assert fetch(lighthouse.status_url)[0] == 200
        assert stop_gracefully(lighthouse.process) == 0
        _, modules = lighthouse.process.wait_for_json(lambda o: o["event"] == "modules", EVENT_TIMEOUT_S)
        assert modules["lighthouse"], "the probe did not run the server"
        assert modules["torch"] == []


class TestCleanLeave:
    def test_member_closing_cleanly_is_reported_as_left_not_lost(self) -> None:
        """A group that finished its step and shuts down must not make its peers abandon the
        collectives they are completing with it (that forked a step's history at job end). The
        notice carries the steps it committed, said as it left (a healer of its finishes there:
        replicaft/heal/departure.py), not those of its last periodic heartbeat."""
        lighthouse = start_lighthouse(status=False)

        async def scenario() -> list[tuple[str, int]]:
            kinds: list[tuple[str, int]] = []
            got = asyncio.Event()

            def on_notice(notice: Notice) -> None:
                if notice.replica_id == "leaver":
                    kinds.append((notice.kind, notice.step))
                    got.set()

            stayer = AsyncLighthouseClient(lighthouse.grpc_address, "stayer", on_notice=on_notice)
            leaver = AsyncLighthouseClient(lighthouse.grpc_address, "leaver")
            await stayer.start()
            await leaver.start()
            await stayer.wait_registered(10)
            await leaver.wait_registered(10)
            await asyncio.gather(stayer.quorum(0, 10), leaver.quorum(0, 10))
            leaver.progress.record(7)
            await leaver.close()
            await asyncio.wait_for(got.wait(), 10)
            await stayer.close()
            return kinds

        assert asyncio.run(scenario()) == [("member_left", 7)]


async def open_raw_session(
    channel: grpc.aio.Channel, replica_id: str, *, instance: str = "", timeout_s: float = EVENT_TIMEOUT_S
) -> grpc.aio.StreamStreamCall:
    """A session stream driven by hand, as a peer not using our client would: registered.
    ``instance`` the client instance it claims to be (the same as a live session's: a reconnect)."""
    call = channel.stream_stream(protocol.SESSION_METHOD)(timeout=timeout_s)
    await call.write(envelope.encode(protocol.Register(replica_id, "", 1, 0, instance=instance)))
    registered = replies.decode_session_reply(await call.read())
    assert isinstance(registered, Notice) and registered.kind == "registered", registered
    return call


async def next_reply(call: grpc.aio.StreamStreamCall) -> replies.QuorumAnswer | replies.QuorumFailed:
    """The next quorum reply on ``call``, skipping notices."""
    while True:
        reply = replies.decode_session_reply(await asyncio.wait_for(call.read(), EVENT_TIMEOUT_S))
        if not isinstance(reply, Notice):
            return reply


class TestQuorumOnSession:
    def test_answers_wrap_the_same_quorum_bytes_and_carry_the_request_number(self) -> None:
        lighthouse = start_lighthouse(status=False)

        async def scenario() -> None:
            async with grpc.aio.insecure_channel(lighthouse.grpc_address) as channel:
                a, b = await open_raw_session(channel, "a"), await open_raw_session(channel, "b")
                # Alone, "a" waits for "b" to join the first quorum: its first request fails with the reason.
                await a.write(envelope.encode(protocol.QuorumRequest("a", 3, "", 1, 0.2, ask=1)))
                failed = await next_reply(a)
                assert isinstance(failed, replies.QuorumFailed) and (failed.ask, failed.code) == (1, "timeout")
                assert (
                    "no quorum with 'a' formed within 0.2s" in failed.reason
                    and "waiting for ['b'] to join" in failed.reason
                )
                await a.write(envelope.encode(protocol.QuorumRequest("a", 3, "", 1, 5.0, ask=2)))
                await b.write(envelope.encode(protocol.QuorumRequest("b", 1, "h:1", 1, 5.0, ask=7)))
                answer_a, answer_b = await next_reply(a), await next_reply(b)
                assert isinstance(answer_a, replies.QuorumAnswer) and isinstance(answer_b, replies.QuorumAnswer)
                assert (answer_a.ask, answer_b.ask) == (2, 7)
                assert answer_a.quorum == answer_b.quorum
                quorum = protocol.Quorum.decode(answer_a.quorum)
                assert (quorum.replica_ids, quorum.steps, quorum.addresses) == (("a", "b"), (3, 1), ("", "h:1"))
                a.cancel()
                b.cancel()

        asyncio.run(scenario())

    @pytest.mark.parametrize(
        ("message", "code", "expected"),
        [
            (
                encode_raw({"v": envelope.PROTOCOL_VERSION, "t": "quorum", **valid_quorum_request(step="7"), "ask": 1}),
                grpc.StatusCode.INVALID_ARGUMENT,
                "QuorumRequest.step is str '7'; expected an integer",
            ),
            (
                envelope.encode(protocol.QuorumRequest("a", 0, "", 1, 1.0, ask=1)),
                grpc.StatusCode.INVALID_ARGUMENT,
                "QuorumRequest.replica_id is 'a' on the session of 'intruder'",
            ),
            (
                envelope.encode(protocol.QuorumRequest("intruder", 0, "", 1, 1.0)),
                grpc.StatusCode.INVALID_ARGUMENT,
                "QuorumRequest.ask is 0 on a session stream",
            ),
            (
                encode_raw({"v": envelope.PROTOCOL_VERSION, "t": "vote"}),
                grpc.StatusCode.INVALID_ARGUMENT,
                "SessionRequest.t is 'vote'; expected one of ['heartbeat', 'quorum']",
            ),
            (
                encode_raw({"v": 1, "t": "heartbeat", "step": 0, "progress": 0}),
                grpc.StatusCode.FAILED_PRECONDITION,
                f"speaks protocol version 1; this side speaks version {envelope.PROTOCOL_VERSION}",
            ),
        ],
        ids=["bad-field", "other-replica", "unnumbered", "unknown-type", "old-version"],
    )
    def test_malformed_session_message_ends_that_session_naming_the_field_while_members_keep_working(
        self, message: bytes, code: grpc.StatusCode, expected: str
    ) -> None:
        lighthouse = start_lighthouse(status=False)
        members = start_group(lighthouse, ["a", "b"])

        async def attack() -> grpc.aio.AioRpcError:
            async with grpc.aio.insecure_channel(lighthouse.grpc_address) as channel:
                call = await open_raw_session(channel, "intruder")
                await call.write(message)
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    while True:
                        await asyncio.wait_for(call.read(), EVENT_TIMEOUT_S)
                return raised.value

        error = asyncio.run(attack())
        assert error.code() == code and expected in (error.details() or ""), (error.code(), error.details())
        for member in members.values():
            wait_notice(member, "member_lost", "intruder")
            wait_quorum(member, ["a", "b"], after=member.mark())

    def test_client_asks_again_on_its_new_session_after_being_fenced(self) -> None:
        """A quorum request in flight when the session is replaced is asked again on the next
        session, not lost: the caller only sees a later quorum."""
        lighthouse = start_lighthouse("--min-replicas", "2", status=False)

        async def scenario() -> tuple[tuple[str, ...], int]:
            fenced = asyncio.Event()

            def on_notice(notice: Notice) -> None:
                if notice.kind == "fenced":
                    fenced.set()

            a = AsyncLighthouseClient(lighthouse.grpc_address, "a", on_notice=on_notice)
            b = AsyncLighthouseClient(lighthouse.grpc_address, "b")
            await a.start()
            try:
                await a.wait_registered(EVENT_TIMEOUT_S)
                # min_replicas=2: "a" cannot be answered until "b" asks too.
                asking = asyncio.create_task(a.quorum(0, 3 * EVENT_TIMEOUT_S))
                async with grpc.aio.insecure_channel(lighthouse.grpc_address) as channel:
                    usurper = await open_raw_session(channel, "a", instance=a.instance)  # a reconnect
                    await asyncio.wait_for(fenced.wait(), EVENT_TIMEOUT_S)
                    usurper.cancel()
                await b.start()
                await b.wait_registered(EVENT_TIMEOUT_S)
                await b.quorum(0, EVENT_TIMEOUT_S)
                quorum = await asyncio.wait_for(asking, EVENT_TIMEOUT_S)
                return quorum.replica_ids, a.session_epoch
            finally:
                await a.close()
                await b.close()

        replica_ids, session_epoch = asyncio.run(scenario())
        assert replica_ids == ("a", "b") and session_epoch == 2


class _SessionCall:
    """A session call's write side. ``cancelled_locally``: the session is cancelled while the
    write is in flight, which grpc reports as asyncio.CancelledError (``_raise_for_status``);
    otherwise the write never completes."""

    def __init__(self, cancelled_locally: bool) -> None:
        self.cancelled_locally = cancelled_locally
        self.writing = asyncio.Event()

    async def write(self, message: bytes) -> None:
        self.writing.set()
        if self.cancelled_locally:
            raise asyncio.CancelledError()
        await asyncio.Event().wait()


def client_on(call: _SessionCall) -> AsyncLighthouseClient:
    client = AsyncLighthouseClient("127.0.0.1:1", "a")
    client._call = call  # type: ignore[assignment]
    client._registered.set()
    return client


class TestSessionEndingMidSend:
    def test_request_in_flight_when_the_session_ends_is_asked_again_not_raised_as_cancellation(self) -> None:
        """Seen in CI: a group fenced while its quorum request was being sent got
        CancelledError out of quorum() and died, instead of asking on its next session."""

        async def scenario() -> BaseException:
            client = client_on(_SessionCall(cancelled_locally=True))
            with pytest.raises(LighthouseUnavailable) as raised:
                await client._ask(protocol.QuorumRequest("a", 0, "", 1, 5.0, ask=1), 5.0)
            return raised.value

        assert "ended while a message was being sent" in str(asyncio.run(scenario()))

    def test_cancelling_the_asking_task_still_cancels_it(self) -> None:
        async def scenario() -> None:
            call = _SessionCall(cancelled_locally=False)
            asking = asyncio.create_task(client_on(call)._ask(protocol.QuorumRequest("a", 0, "", 1, 5.0, ask=1), 5.0))
            await asyncio.wait_for(call.writing.wait(), EVENT_TIMEOUT_S)
            asking.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asking

        asyncio.run(scenario())


class TestClientDeadline:
    def test_lighthouse_that_never_answers_a_quorum_request_gives_a_quorum_timeout(self) -> None:
        """The client's own deadline for a request in flight (lighthouse/client/asks.py), against a
        server that registers sessions and then answers nothing."""

        async def silent_session(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.read()  # Register
            yield envelope.encode(Notice("registered", incarnation=1))
            while await context.read() is not grpc.aio.EOF:
                pass

        async def scenario() -> str:
            server = grpc.aio.server()
            server.add_generic_rpc_handlers(
                (
                    grpc.method_handlers_generic_handler(
                        protocol.SERVICE, {"Session": grpc.stream_stream_rpc_method_handler(silent_session)}
                    ),
                )
            )
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            client = AsyncLighthouseClient(f"127.0.0.1:{port}", "a")
            await client.start()
            try:
                await client.wait_registered(EVENT_TIMEOUT_S)
                with pytest.raises(QuorumTimeout) as raised:
                    await client.quorum(0, 0.2)
                return str(raised.value)
            finally:
                await client.close()
                await server.stop(0)

        message = asyncio.run(scenario())
        assert "did not answer quorum request 1 of 'a' within 1." in message, message
