"""A group started on a fresh machine while its object store is down (issue 37, bug 1).

Real processes: a real lighthouse, ``examples/train_ddp.py`` uploading to a real SeaweedFS
(chaos/s3_server.py) through the fault proxy, which answers 503 while the server is killed.
Before the fix, a group restarted with an empty local checkpoint directory during an outage
trained from step 0 under a new lineage and uploaded that second history beside the first.
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import pytest
from conftest import ManagedProcess, spawn_python, start_lighthouse
from support.training_events import read_events, start_checkpointing_group, wait_for_event

from chaos.s3_server import S3Server
from replicaft.launch.children import free_port

pytestmark = pytest.mark.slow

BUCKET = "replicaft-outage"
WAIT_S = 120.0


def group_on(server: S3Server, lighthouse: str, tmp: Path, store: str, steps: int = 30, **env: str) -> ManagedProcess:
    """A group training to ``steps`` whose local checkpoint directory is ``tmp/ckpt`` (empty on a fresh machine)."""
    return start_checkpointing_group(
        lighthouse,
        "g0",
        tmp,
        "--steps",
        str(steps),
        "--step-delay",
        "0.02",
        REPLICAFT_CHECKPOINT_OBJECT_STORE=store,
        REPLICAFT_CHECKPOINT_OBJECT_STORE_ENDPOINT=server.endpoint,
        AWS_ACCESS_KEY_ID="replicaft",
        AWS_SECRET_ACCESS_KEY="replicaft",
        AWS_DEFAULT_REGION="us-east-1",
        **env,
    )


@pytest.mark.timeout(300)
def test_a_fresh_machine_waits_for_a_store_that_is_down_and_never_trains_from_scratch(tmp_path: Path) -> None:
    server = S3Server(buckets=[BUCKET]).start()
    try:
        store = f"s3://{BUCKET}/{uuid.uuid4().hex}"
        lh = start_lighthouse(status=False)
        first = group_on(server, lh.grpc_address, tmp_path / "a", store)
        assert first.wait_exit(WAIT_S) == 0, first.output_tail()
        uploads = [e for e in read_events(tmp_path / "a" / "events") if e["event"] == "checkpoint_upload" and e["ok"]]
        assert uploads, "the first run uploaded nothing"
        stored_step = max(e["checkpoint_step"] for e in uploads)

        server.kill()  # the proxy answers 503 from now on
        # A fresh machine, the store down, a short wait: it stops, naming the store, untrained.
        stopped = group_on(server, lh.grpc_address, tmp_path / "b", store, REPLICAFT_CHECKPOINT_STORE_WAIT_S="3")
        assert stopped.wait_exit(WAIT_S) == 1, stopped.output_tail()
        said = stopped.output_tail(50)
        assert "has not answered for" in said and "Not training from step 0" in said and "Traceback" not in said, said
        b_events = read_events(tmp_path / "b" / "events")
        assert not [e for e in b_events if e["event"] == "commit" and e["committed"]], "it trained from scratch"

        # Another fresh machine, a longer wait: it waits, the store comes back, and it resumes.
        waiting = group_on(server, lh.grpc_address, tmp_path / "c", store, steps=40)
        wait_for_event(
            tmp_path / "c" / "events", lambda e: e["event"] == "resume_store_waiting", WAIT_S, "a wait for the store"
        )
        server.start()
        resume = wait_for_event(tmp_path / "c" / "events", lambda e: e["event"] == "resume", WAIT_S, "the resume")
        assert resume["checkpoint_step"] == stored_step, resume
        assert waiting.wait_exit(WAIT_S) == 0, waiting.output_tail()
        c_events = read_events(tmp_path / "c" / "events")
        c_commits = [e["step"] for e in c_events if e["event"] == "commit" and e["committed"]]
        assert c_commits and min(c_commits) == stored_step + 1, c_commits[:5]
    finally:
        server.close()


@pytest.mark.timeout(180)
def test_a_fresh_machine_behind_a_black_holed_store_stops_within_its_wait(tmp_path: Path) -> None:
    """Issue 37: a store that accepts connections and never answers (a partition, no reset)
    held the first step for about 300 s of boto3 timeouts and retries. The survey runs on its
    own thread and each quorum waits for it a bounded time, so the group stops after
    ``checkpoint_store_wait_s``, naming the store, untrained, the request still hung."""
    server = S3Server(buckets=[BUCKET]).start()
    try:
        host_port = server.endpoint.removeprefix("http://")
        listen = str(free_port())
        relay = spawn_python("-m", "chaos.blackhole", listen, host_port, name="blackhole")
        relay.wait_for_line(lambda t: t == "ready", 30, what="ready")
        relay.send_signal(signal.SIGUSR1)  # from now on: connections accepted, nothing answered
        lh = start_lighthouse(status=False)
        started = time.monotonic()
        group = start_checkpointing_group(
            lh.grpc_address, "g0", tmp_path, "--steps", "30",
            REPLICAFT_CHECKPOINT_OBJECT_STORE=f"s3://{BUCKET}/{uuid.uuid4().hex}",
            REPLICAFT_CHECKPOINT_OBJECT_STORE_ENDPOINT=f"http://127.0.0.1:{listen}",
            REPLICAFT_CHECKPOINT_STORE_WAIT_S="5",
            AWS_ACCESS_KEY_ID="replicaft", AWS_SECRET_ACCESS_KEY="replicaft", AWS_DEFAULT_REGION="us-east-1",
        )  # fmt: skip
        assert group.wait_exit(120) == 1, group.output_tail()
        took_s = time.monotonic() - started
        said = group.output_tail(50)
        assert "has not answered for" in said and "Not training from step 0" in said and "Traceback" not in said, said
        assert f"127.0.0.1:{listen}" in said, said
        events = read_events(tmp_path / "events")
        assert not [e for e in events if e["event"] == "commit" and e["committed"]], "it trained from scratch"
        # Start-up (~5 s of imports) + the 5 s wait + one quorum's bounded wait: far below boto3's
        # own 10 s connect + 60 s read timeouts per request, retried.
        assert took_s < 60, took_s
    finally:
        server.close()
