"""Loading never runs pickle, every load failure falls back, and last release's checkpoints load.

Issue 19 bug 4: DCP read ``.metadata`` with ``pickle.load``, so a planted ``.metadata`` (its
manifest entry re-hashed) ran code on resume; DCP's ``CheckpointException`` is a
``BaseException`` and passed through ``except Exception``, so resume crashed instead of
trying the previous checkpoint. Issue 22: a checkpoint of the previous release's format
(``tests/fixtures/checkpoint_v1``, written by that release) still loads, bitwise.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from replicaft.checkpoint import CheckpointReader, CheckpointWriter
from replicaft.checkpoint.__main__ import main
from replicaft.checkpoint.layout import DCP_METADATA_FILE, LEGACY_LINEAGE, MANIFEST_FILE
from replicaft.errors import CheckpointCorrupt
from replicaft.state import digest, flatten
from replicaft.transfer.snapshot import Snapshot

FIXTURE = Path(__file__).parent / "fixtures" / "checkpoint_v1"


def state(step: int) -> dict[str, object]:
    return {"replicaft": {"step": step}, "model": {"w": torch.full((64,), float(step))}}


def write(directory: Path, steps: list[int]) -> list[Path]:
    paths = []
    with CheckpointWriter(directory, keep_last=10) as writer:
        for step in steps:
            snap = Snapshot.capture(flatten(state(step)), step=step, quorum_id=1, replica_id="g0")
            result = writer.save_async(snap, step).wait(60)
            assert result.ok and result.path is not None, result.reason
            paths.append(result.path)
    return paths


def replace_and_rehash(checkpoint: Path, name: str, data: bytes) -> None:
    """What an attacker with write access does: swap a file and fix its manifest entry."""
    (checkpoint / name).write_bytes(data)
    manifest = json.loads((checkpoint / MANIFEST_FILE).read_text())
    for entry in manifest["files"]:
        if entry["name"] == name:
            entry["num_bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (checkpoint / MANIFEST_FILE).write_text(json.dumps(manifest))


class _Plant:
    """Unpickling this calls ``os.mkdir(marker)``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (str(self.marker),))


def test_planted_dcp_metadata_never_runs_and_resume_falls_back(tmp_path: Path) -> None:
    older, newer = write(tmp_path / "ckpt", [10, 20])
    marker = tmp_path / "pwned"
    replace_and_rehash(newer, DCP_METADATA_FILE, pickle.dumps(_Plant(marker)))
    assert CheckpointReader.verify(newer)[0]  # the checksums match: only the content is hostile

    with pytest.raises(CheckpointCorrupt, match=r"names posix\.mkdir, which DCP metadata never holds"):
        CheckpointReader.load(newer)
    loaded = CheckpointReader(tmp_path / "ckpt").load_latest_valid()

    assert not marker.exists()
    assert loaded is not None and loaded.path == older


def test_metadata_pointing_outside_the_checkpoint_is_refused(tmp_path: Path) -> None:
    (path,) = write(tmp_path, [10])
    metadata = (path / DCP_METADATA_FILE).read_bytes().replace(b"__0_0.distcp", b"../../passwd")
    replace_and_rehash(path, DCP_METADATA_FILE, metadata)
    with pytest.raises(CheckpointCorrupt, match=r"is stored in '\.\./\.\./passwd'"):
        CheckpointReader.load(path)


def test_dcp_checkpoint_exception_is_a_bad_checkpoint_not_a_crash(tmp_path: Path) -> None:
    older, newer = write(tmp_path, [10, 20])
    shard = next(newer.glob("*.distcp"))
    replace_and_rehash(newer, shard.name, b"\x00" * shard.stat().st_size)  # torch.load fails inside DCP

    with pytest.raises(CheckpointCorrupt, match="could not load the tensors"):
        CheckpointReader.load(newer)
    loaded = CheckpointReader(tmp_path).load_latest_valid()
    assert loaded is not None and loaded.path == older and loaded.state["model"]["w"].eq(10.0).all()


def test_previous_release_checkpoint_loads_bitwise(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    expected = json.loads((FIXTURE / "expected.json").read_text())
    shutil.copytree(FIXTURE, tmp_path / "old")

    loaded = CheckpointReader(tmp_path / "old").load_latest_valid()

    assert loaded is not None and loaded.step == expected["step"] and loaded.lineage == LEGACY_LINEAGE
    assert digest(flatten(loaded.state)) == expected["digest"]
    assert main(["verify", str(tmp_path / "old" / "step-000000003")]) == 0
    assert capsys.readouterr().out.startswith("valid: step-000000003: 3 files")
