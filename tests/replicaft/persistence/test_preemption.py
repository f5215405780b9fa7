"""Preemption notices (replicaft/persistence/preemption.py): the answer rule by table, the watcher against a
real local metadata server, and a real two-group job whose writer is announced mid-run.

The metadata server is stdlib ``http.server`` on 127.0.0.1 port 0, in this process: it
speaks GCE's (``Metadata-Flavor: Google`` required) and AWS's (IMDSv2 session token) dialects,
and a test changes what a path answers. Nothing sleeps to synchronise: tests wait, with a
deadline, for a request count, a callback or an event in the log.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import spawn_python, start_lighthouse
from support.training_events import EXAMPLE, read_events, wait_for_event

from replicaft.checkpoint import CheckpointReader
from replicaft.checkpoint.layout import MANIFEST_FILE
from replicaft.config.options import ManagerOptions
from replicaft.errors import OptionsError
from replicaft.persistence.duties import Persistence
from replicaft.persistence.preemption import (
    AWS_URL,
    GCE_URL,
    NoticeSource,
    PreemptionWatcher,
    Reading,
    parse_notice_source,
    read_answer,
)
from replicaft.transfer.spare import SpareBuffer

AWS_NOTICE = '{"action": "terminate", "time": "2026-11-27T15:02:00Z"}'
AWS_PATH = "/latest/meta-data/spot/instance-action"
GCE_PATH = "/computeMetadata/v1/instance/preempted"
TOKEN = "token-abc"


# -- the rule ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "status", "body", "expected"),
    [
        ("gce", 200, "FALSE", Reading(False, "instance/preempted is FALSE")),
        ("gce", 200, "TRUE\n", Reading(True, "instance/preempted is TRUE")),
        ("gce", 200, "true", Reading(True, "instance/preempted is TRUE")),
        (
            "gce",
            200,
            "<html>",
            Reading(False, "instance/preempted is '<html>', neither TRUE nor FALSE", understood=False),
        ),
        ("gce", 403, "", Reading(False, "HTTP 403 (outside GCE, or no Metadata-Flavor header?)", understood=False)),
        ("aws", 404, "<html>Not Found</html>", Reading(False, "no spot instance-action")),
        ("aws", 200, AWS_NOTICE, Reading(True, "spot instance-action terminate at 2026-11-27T15:02:00Z")),
        ("aws", 200, "stop", Reading(True, "spot instance-action 'stop'")),
        ("aws", 401, "", Reading(False, "HTTP 401 (outside EC2, or an IMDSv2 token refused?)", understood=False)),
        ("http", 200, "", Reading(True, "HTTP 200")),
        ("http", 200, "going down", Reading(True, "HTTP 200 ('going down')")),
        ("http", 404, "", Reading(False, "HTTP 404")),
        ("http", 204, "", Reading(False, "HTTP 204")),
        ("http", 503, "", Reading(False, "HTTP 503 (server error)", understood=False)),
        ("file", 404, "", Reading(False, "no notice file")),
        ("file", 200, "", Reading(True, "the notice file exists")),
        ("file", 200, "TRUE", Reading(True, "the notice file exists ('TRUE')")),
        ("file", 200, "false\n", Reading(False, "the notice file says 'false'")),
        ("file", 200, "0", Reading(False, "the notice file says '0'")),
    ],
)
def test_read_answer(kind: Any, status: int, body: str, expected: Reading) -> None:
    assert read_answer(kind, status, body) == expected


@pytest.mark.parametrize(
    ("notice", "kind", "expected"),
    [
        (None, "auto", None),
        ("", "auto", None),
        ("gce", "auto", NoticeSource("gce", GCE_URL)),
        ("aws", "auto", NoticeSource("aws", AWS_URL)),
        (
            "http://127.0.0.1:8080/computeMetadata/v1/instance/preempted",
            "auto",
            NoticeSource("gce", "http://127.0.0.1:8080/computeMetadata/v1/instance/preempted"),
        ),
        (
            "http://10.0.0.1/x/latest/meta-data/spot/instance-action",
            "auto",
            NoticeSource("aws", "http://10.0.0.1/x/latest/meta-data/spot/instance-action"),
        ),
        ("https://agent.local/preempt", "auto", NoticeSource("http", "https://agent.local/preempt")),
        ("https://agent.local/preempt", "gce", NoticeSource("gce", "https://agent.local/preempt")),
        ("file:/run/preempted", "auto", NoticeSource("file", "/run/preempted")),
        ("file:///run/preempted", "file", NoticeSource("file", "/run/preempted")),
    ],
)
def test_parse_notice_source(notice: str | None, kind: str, expected: NoticeSource | None) -> None:
    assert parse_notice_source(notice, kind) == expected


@pytest.mark.parametrize(
    ("notice", "kind", "message"),
    [
        ("169.254.169.254/latest", "auto", "is not a source; use 'gce', 'aws', an http(s):// URL"),
        ("gce", "spot", "preemption_notice_kind='spot'; use one of auto, gce, aws, http, file"),
        ("http://x/y", "file", "is a URL but preemption_notice_kind='file'"),
        ("file:/run/preempted", "aws", "a file source is file:/absolute/path"),
        ("file:", "auto", "a file source is file:/absolute/path"),
        ("file:run/preempted", "file", "a file source is file:/absolute/path"),
    ],
)
def test_bad_notice_source_is_refused_naming_the_fix(notice: str, kind: str, message: str) -> None:
    with pytest.raises(OptionsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ManagerOptions(lighthouse="127.0.0.1:1", replica_id="g0", preemption_notice=notice, preemption_notice_kind=kind)


def test_options_read_the_notice_from_the_environment_and_refuse_a_zero_poll() -> None:
    env = {"REPLICAFT_PREEMPTION_NOTICE": "aws", "REPLICAFT_PREEMPTION_POLL_S": "0.5"}
    o = ManagerOptions.from_env(env, lighthouse="127.0.0.1:1", replica_id="g0")
    assert (o.preemption_notice, o.preemption_notice_kind, o.preemption_poll_s) == ("aws", "auto", 0.5)
    for poll_s in (0, float("inf")):
        with pytest.raises(OptionsError, match=rf"preemption_poll_s={poll_s} is outside \[0.01, 3600\]"):
            ManagerOptions(lighthouse="127.0.0.1:1", replica_id="g0", preemption_notice="gce", preemption_poll_s=poll_s)


# -- a local metadata server ----------------------------------------------------------------


class MetadataServer:
    """GCE/AWS-style metadata on 127.0.0.1 (port 0). ``answer(path, status, body)`` sets what a
    path says; ``hang_up(path)`` makes it close the connection without an answer. Paths ending
    in GCE_PATH require ``Metadata-Flavor: Google``; paths ending in AWS_PATH require the IMDSv2
    token that ``PUT /latest/api/token`` issues (401 without it), unless ``imdsv1_only`` (no
    tokens issued, none needed)."""

    def __init__(self, *, imdsv1_only: bool = False) -> None:
        self._answers: dict[str, tuple[int, str] | None] = {}
        self._lock = threading.Condition()
        self.requests: dict[str, int] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                if imdsv1_only:
                    self._reply(405, "")
                elif self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    self._reply(200, TOKEN)
                else:
                    self._reply(400, "")

            def do_GET(self) -> None:
                with server._lock:
                    server.requests[self.path] = server.requests.get(self.path, 0) + 1
                    server._lock.notify_all()
                    answer = server._answers.get(self.path, (404, ""))
                if answer is None:
                    self.close_connection = True  # no status line: the client sees the connection drop
                elif self.path.endswith(GCE_PATH) and self.headers.get("Metadata-Flavor") != "Google":
                    self._reply(403, "Missing Metadata-Flavor:Google header.")
                elif (
                    self.path.endswith(AWS_PATH)
                    and not imdsv1_only
                    and self.headers.get("X-aws-ec2-metadata-token") != TOKEN
                ):
                    self._reply(401, "")
                else:
                    self._reply(*answer)

            def _reply(self, status: int, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def answer(self, path: str, status: int, body: str = "") -> None:
        with self._lock:
            self._answers[path] = (status, body)

    def hang_up(self, path: str) -> None:
        with self._lock:
            self._answers[path] = None

    def wait_requests(self, path: str, count: int, timeout_s: float) -> None:
        with self._lock:
            if not self._lock.wait_for(lambda: self.requests.get(path, 0) >= count, timeout_s):
                raise AssertionError(
                    f"{path} was asked {self.requests.get(path, 0)} times, not {count}, within {timeout_s:g}s"
                )

    def __enter__(self) -> MetadataServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)


@pytest.fixture
def metadata() -> Iterator[MetadataServer]:
    with MetadataServer() as server:
        yield server


class Recorder:
    """The watcher's two sinks: the notice callback and the event log."""

    def __init__(self) -> None:
        self.noticed = threading.Event()
        self.reasons: list[str] = []
        self.events: list[tuple[str, dict[str, Any]]] = []

    def on_notice(self, reason: str) -> None:
        self.reasons.append(reason)
        self.noticed.set()

    def emit(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))

    def named(self, event: str) -> list[dict[str, Any]]:
        return [fields for name, fields in self.events if name == event]


def watch(source: NoticeSource, recorder: Recorder, poll_s: float = 0.02) -> PreemptionWatcher:
    watcher = PreemptionWatcher(source, poll_s, recorder.on_notice, recorder.emit, "g0/0")
    watcher.start()
    return watcher


# -- the watcher --------------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", ["gce", "aws", "aws-imdsv1"])
def test_watcher_announces_once_the_metadata_says_so(dialect: str) -> None:
    kind = dialect.removesuffix("-imdsv1")
    path, quiet, loud = (
        (GCE_PATH, (200, "FALSE"), (200, "TRUE")) if kind == "gce" else (AWS_PATH, (404, ""), (200, AWS_NOTICE))
    )
    recorder = Recorder()
    with MetadataServer(imdsv1_only=dialect == "aws-imdsv1") as metadata:
        metadata.answer(path, *quiet)
        watcher = watch(parse_notice_source(metadata.url + path), recorder)
        try:
            metadata.wait_requests(path, 3, timeout_s=10)
            assert not recorder.noticed.is_set() and not recorder.events, recorder.events
            metadata.answer(path, *loud)
            assert recorder.noticed.wait(10), "no notice within 10 s"
        finally:
            watcher.stop()
    reason = "instance/preempted is TRUE" if kind == "gce" else "spot instance-action terminate at 2026-11-27T15:02:00Z"
    assert recorder.reasons == [f"notice from {kind} {metadata.url}{path}: {reason}"]
    assert recorder.named("preemption_notice") == [{"source": metadata.url + path, "kind": kind, "reason": reason}]


def test_unreachable_source_is_logged_once_retried_and_a_later_notice_still_counts(
    metadata: MetadataServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="replicaft.persistence.preemption")
    metadata.hang_up("/notice")
    recorder = Recorder()
    watcher = watch(NoticeSource("http", metadata.url + "/notice"), recorder)
    try:
        metadata.wait_requests("/notice", 4, timeout_s=10)
        errors = recorder.named("preemption_source_error")
        assert len(errors) == 1 and "RemoteDisconnected" in errors[0]["error"], recorder.events
        metadata.answer("/notice", 200)
        assert recorder.noticed.wait(10), "no notice within 10 s"
    finally:
        watcher.stop()
    assert len(recorder.named("preemption_source_error")) == 1
    assert len([r for r in caplog.records if "cannot be read" in r.getMessage()]) == 1
    assert any("readable again" in r.getMessage() for r in caplog.records)


def test_file_notice_counts_once_the_file_exists_and_does_not_say_false(tmp_path: Path) -> None:
    notice = tmp_path / "preempted"
    recorder = Recorder()
    watcher = PreemptionWatcher(parse_notice_source(f"file:{notice}"), 0.02, recorder.on_notice, recorder.emit, "g0/0")
    assert watcher.poll_once() == Reading(False, "no notice file")
    notice.write_text("FALSE")
    assert watcher.poll_once() == Reading(False, "the notice file says 'FALSE'")
    watcher.start()
    try:
        # Replaced at once, as a node agent should: truncating "FALSE" in place would show
        # an empty file for a moment, which is a notice (existence alone announces one).
        (tmp_path / "next").write_text("TRUE")
        (tmp_path / "next").replace(notice)
        assert recorder.noticed.wait(10), "no notice within 10 s"
    finally:
        watcher.stop()
    assert recorder.reasons == [f"notice from file {notice}: the notice file exists ('TRUE')"]


def test_a_fifo_as_the_notice_file_is_refused_at_once_naming_it(tmp_path: Path) -> None:
    notice = tmp_path / "preempted"
    os.mkfifo(notice)
    recorder = Recorder()
    watcher = watch(parse_notice_source(f"file:{notice}"), recorder)
    try:
        deadline = time.monotonic() + 10
        while not recorder.named("preemption_source_error") and time.monotonic() < deadline:
            recorder.noticed.wait(0.01)
        errors = recorder.named("preemption_source_error")
        assert errors and f"the preemption notice file {notice} is a fifo, not a regular file" in errors[0]["error"]
        started = time.monotonic()
        watcher.stop(timeout_s=5)
        assert time.monotonic() - started < 1.0, "the watcher was blocked opening the FIFO"
    finally:
        watcher.stop()
        try:  # release a watcher left blocked in open (the bug) rather than keep it forever
            os.close(os.open(notice, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    assert not recorder.noticed.is_set()


def test_stop_ends_the_watcher_thread_promptly(metadata: MetadataServer) -> None:
    recorder = Recorder()
    watcher = watch(NoticeSource("http", metadata.url + "/quiet"), recorder, poll_s=60)
    metadata.wait_requests("/quiet", 1, timeout_s=10)
    started = time.monotonic()
    watcher.stop(timeout_s=5)
    assert time.monotonic() - started < 1.0
    assert not [t for t in threading.enumerate() if t.name == "replicaft-preemption-watcher"]


# -- persistence: the same flag as SIGTERM ------------------------------------------------------


def persistence(recorder: Recorder) -> Persistence:
    return Persistence(ManagerOptions(lighthouse="127.0.0.1:1", replica_id="g0"), recorder.emit, SpareBuffer())


def test_sigterm_after_a_notice_is_reported_with_the_lead_time() -> None:
    recorder = Recorder()
    p = persistence(recorder)
    p.start()
    try:
        p.preempt("notice from http x: HTTP 200")
        # The handler runs on this (the main) thread before os.kill returns to the test.
        os.kill(os.getpid(), signal.SIGTERM)
    finally:
        p.close()
    assert p.preempted.is_set() and p.preemption_reason == "notice from http x: HTTP 200"
    (report,) = recorder.named("preemption_sigterm")
    assert 0 <= report["after_notice_s"] < 5


def test_sigterm_first_stays_the_reason() -> None:
    recorder = Recorder()
    p = persistence(recorder)
    p.start()
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # handled on this thread before os.kill returns
        assert p.preempted.is_set()
        p.preempt("notice from http x: HTTP 200")
    finally:
        p.close()
    assert p.preemption_reason == "SIGTERM"
    assert not recorder.named("preemption_sigterm")


# -- a real job -----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_announced_writer_saves_and_leaves_before_any_sigterm_other_group_carries_on(
    tmp_path: Path, metadata: MetadataServer
) -> None:
    lh = start_lighthouse(status=False)
    events, ckpt = tmp_path / "events", tmp_path / "ckpt"
    groups = {}
    for rid in ("g0", "g1"):
        metadata.answer(f"/{rid}{AWS_PATH}", 404)
        env = dict(os.environ)
        env.update(
            REPLICAFT_LIGHTHOUSE=lh.grpc_address,
            REPLICAFT_REPLICA_ID=rid,
            REPLICAFT_EVENTS_DIR=str(events),
            REPLICAFT_CHECKPOINT_DIR=str(ckpt),
            REPLICAFT_CHECKPOINT_INTERVAL_STEPS="1000",
            REPLICAFT_PREEMPTION_NOTICE=f"{metadata.url}/{rid}{AWS_PATH}",
            REPLICAFT_PREEMPTION_POLL_S="0.05",
        )
        env.pop("REPLICAFT_FAULT_POINTS", None)
        groups[rid] = spawn_python(EXAMPLE, "--steps", "400", "--step-delay", "0.02", name=rid, env=env)
    wait_for_event(
        events, lambda e: e["event"] == "commit" and e["committed"] and e["step"] >= 3, 90, "step 3 committed"
    )
    writer = next(
        e["replica_id"] for e in reversed(read_events(events)) if e["event"] == "quorum" and e["replica_rank"] == 0
    )
    other = "g1" if writer == "g0" else "g0"
    metadata.answer(f"/{writer}{AWS_PATH}", 200, AWS_NOTICE)

    code = groups[writer].wait_exit(60)
    assert code == 143, f"{writer} exited with {code} (-15 would be death by SIGTERM)\n{groups[writer].output_tail()}"
    log = read_events(events)
    mine = [e for e in log if e["replica_id"] == writer]
    (notice,) = [e for e in mine if e["event"] == "preemption_notice"]
    assert notice["kind"] == "aws" and notice["reason"] == "spot instance-action terminate at 2026-11-27T15:02:00Z"
    (stop,) = [e for e in mine if e["event"] == "stop" and "preempted" in e["reason"]]
    assert "notice from aws" in stop["reason"] and "SIGTERM" not in stop["reason"], stop
    assert not [e for e in mine if e["event"] == "preemption_sigterm"]
    last = max(e["step"] for e in mine if e["event"] == "commit" and e["committed"])
    saved = [e for e in mine if e["event"] == "checkpoint" and e["ok"]]
    assert [e["checkpoint_step"] for e in saved] == [last], f"{writer} committed up to {last}; saved {saved}"
    (newest,) = [i for i in CheckpointReader(ckpt).list() if i.valid]
    assert json.loads((newest.path / MANIFEST_FILE).read_text())["metadata"]["reason"] == "preemption"

    wait_for_event(
        events,
        lambda e: e["event"] == "commit" and e["committed"] and e["replica_id"] == other and e["step"] >= last + 3,
        60,
        f"{other} going on alone",
    )
    assert groups[other].popen.poll() is None, "the other group carries on"
    assert not [e for e in read_events(events) if e["event"] == "preemption_notice" and e["replica_id"] == other]


BURST_CHILD = """
import json, time
from replicaft.config.options import ManagerOptions
from replicaft.persistence.duties import Persistence
from replicaft.transfer.spare import SpareBuffer

p = Persistence(ManagerOptions(lighthouse="127.0.0.1:1", replica_id="g0"), lambda *a, **k: None, SpareBuffer())
p.start()
print(json.dumps({"event": "ready"}), flush=True)
until = time.monotonic() + 2.0
while time.monotonic() < until:
    time.sleep(0.0005)  # as a training loop's step does: every signal interrupts it
print(json.dumps({"event": "alive", "preempted": p.preempted.is_set()}), flush=True)
"""


@pytest.mark.parametrize("trial", range(3))
def test_a_burst_of_sigterms_never_deadlocks_the_handler(trial: int) -> None:
    """The sender's SIGTERM and torchrun's forwarded one arrive together; with a handler that
    took a lock, the second, run inside the first, deadlocked the main thread (one trial in
    five of 20000 signals did, measured with ``threading.Event.set`` as the handler)."""
    child = spawn_python("-c", BURST_CHILD, name=f"sigterm-burst-{trial}")
    child.wait_for_json(lambda o: o.get("event") == "ready", 60.0, what="the child's handler")
    for _ in range(20000):
        os.kill(child.popen.pid, signal.SIGTERM)
    _, alive = child.wait_for_json(lambda o: o.get("event") == "alive", 30.0, what="the child after the burst")
    assert alive["preempted"] is True
    assert child.wait_exit(30.0) == 0
