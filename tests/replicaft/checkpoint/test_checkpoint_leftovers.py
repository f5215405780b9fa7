"""A writer's start-up cleanup removes only temporaries that are provably abandoned (issue 37).

A second writer in the same directory once removed the first one's in-flight ``.tmp-*`` save.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import torch

from replicaft.checkpoint import CheckpointWriter
from replicaft.checkpoint.layout import tmp_dirname
from replicaft.checkpoint.leftovers import ABANDONED_AFTER_S, host_digest, is_abandoned, owner_token
from replicaft.state.flat import flatten
from replicaft.transfer.snapshot import Snapshot


def save_one(directory: Path, step: int) -> None:
    snap = Snapshot.capture(
        flatten({"replicaft": {"step": step}, "w": torch.ones(8)}), step=step, quorum_id=1, replica_id="g"
    )
    with CheckpointWriter(directory, writer_id="second") as writer:
        result = writer.save_async(snap, step).wait(60)
    assert result.ok, result.reason


def test_is_abandoned_only_for_a_dead_owner_of_this_host_or_an_old_temporary() -> None:
    here, there = host_digest("a"), host_digest("b")
    token = owner_token(123, uuid.uuid4().hex, host="a")
    assert is_abandoned(token, 1.0, this_host=here, pid_alive=False)
    assert not is_abandoned(token, 1.0, this_host=here, pid_alive=True)
    assert not is_abandoned(token, 1.0, this_host=there, pid_alive=None)  # another host's: only by age
    assert not is_abandoned("abc123", 1.0, this_host=here, pid_alive=None)  # names no owner: only by age
    assert is_abandoned("abc123", ABANDONED_AFTER_S, this_host=here, pid_alive=None)
    assert is_abandoned(f"deleting-{token}", 1.0, this_host=here, pid_alive=False)


def test_second_writer_leaves_a_live_writers_save_alone_and_removes_a_dead_ones(tmp_path: Path) -> None:
    owner = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        in_flight = tmp_path / tmp_dirname("step-000000500", owner_token(owner.pid, uuid.uuid4().hex))
        in_flight.mkdir()
        (in_flight / "pack-0.bin").write_bytes(b"half a save")
        old = tmp_path / tmp_dirname("step-000000400", "abc123")
        old.mkdir()
        os.utime(old, (time.time() - ABANDONED_AFTER_S - 60,) * 2)

        save_one(tmp_path, 10)
        assert in_flight.is_dir() and (in_flight / "pack-0.bin").read_bytes() == b"half a save"
        assert not old.exists()
    finally:
        owner.communicate(b"", timeout=30)
    assert owner.returncode == 0
    save_one(tmp_path, 20)  # its owner is gone: now it is garbage
    assert not in_flight.exists()
