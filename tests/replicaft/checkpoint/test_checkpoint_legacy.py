"""Loading never runs pickle, every load failure falls back, and last release's checkpoints load.

Issue 19 bug 4: DCP read ``.metadata`` with ``pickle.load``, so a planted ``.metadata`` (its
manifest entry re-hashed) ran code on resume; DCP's ``CheckpointException`` is a
``BaseException`` and passed through ``except Exception``, so resume crashed instead of
trying the previous checkpoint. Issue 22: checkpoints of the previous releases' formats
(``tests/support/fixtures/checkpoint_v1`` and ``checkpoint_v2``, each written by that release) still
load, bitwise, through the same restricted reader, and a save after one continues its
lineage. This release's format (versions 3 and 4) holds no pickle at all.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import shutil
from pathlib import Path

import msgpack
import pytest
import torch
from conftest import REPO_ROOT

from replicaft.checkpoint import CheckpointReader, CheckpointWriter
from replicaft.checkpoint.__main__ import main
from replicaft.checkpoint.layout import (
    DCP_METADATA_FILE,
    LEGACY_LINEAGE,
    MANIFEST_FILE,
    TENSORS_FILE,
)
from replicaft.checkpoint.manifest import FORMAT_VERSION
from replicaft.checkpoint.reader import load
from replicaft.errors import CheckpointCorrupt
from replicaft.state.flat import Flat, digest, flatten, tensor_bytes
from replicaft.transfer.snapshot import Snapshot

FIXTURES = REPO_ROOT / "tests" / "support" / "fixtures"
FIXTURE = FIXTURES / "checkpoint_v1"


def release_digest(flat: Flat) -> str:
    """The state digest as the releases that wrote the fixtures computed it (one BLAKE2b pass
    over the skeleton, dtypes, shapes and bytes), which their ``expected.json`` records; this
    release digests content hashes instead (replicaft/state/content.py)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(msgpack.packb(flat.skeleton, use_bin_type=True))
    for t in flat.tensors:
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(tensor_bytes(t).numpy().data)
    return h.hexdigest()


def state(step: int) -> dict[str, object]:
    return {"replicaft": {"step": step}, "model": {"w": torch.full((64,), float(step))}}


def write(directory: Path, steps: list[int]) -> list[Path]:
    paths = []
    with CheckpointWriter(directory, keep_last=10, chain_length=1) as writer:
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


def legacy_pair(directory: Path) -> tuple[Path, Path]:
    """Two checkpoints of the previous release's format: the fixture (step 3) and a copy of it
    published as step 2 (its manifest says so; the manifest itself is not checksummed)."""
    newer = directory / "step-000000003"
    shutil.copytree(FIXTURE / newer.name, newer)
    older = directory / "step-000000002"
    shutil.copytree(FIXTURE / newer.name, older)
    manifest = json.loads((older / MANIFEST_FILE).read_text())
    manifest["step"] = 2
    (older / MANIFEST_FILE).write_text(json.dumps(manifest))
    return older, newer


def test_planted_dcp_metadata_never_runs_and_resume_falls_back(tmp_path: Path) -> None:
    older, newer = legacy_pair(tmp_path / "ckpt")
    marker = tmp_path / "pwned"
    replace_and_rehash(newer, DCP_METADATA_FILE, pickle.dumps(_Plant(marker)))
    assert CheckpointReader.verify(newer)[0]  # the checksums match: only the content is hostile

    with pytest.raises(CheckpointCorrupt, match=r"names posix\.mkdir, which DCP metadata never holds"):
        load(newer)
    loaded = CheckpointReader(tmp_path / "ckpt").load_latest_valid()

    assert not marker.exists()
    assert loaded is not None and loaded.path == older


def test_metadata_pointing_outside_the_checkpoint_is_refused(tmp_path: Path) -> None:
    _, path = legacy_pair(tmp_path)
    metadata = (path / DCP_METADATA_FILE).read_bytes().replace(b"__0_0.distcp", b"../../passwd")
    replace_and_rehash(path, DCP_METADATA_FILE, metadata)
    with pytest.raises(CheckpointCorrupt, match=r"is stored in '\.\./\.\./passwd'"):
        load(path)


@pytest.mark.parametrize("version", [1, 3])
def test_dcp_checkpoint_exception_is_a_bad_checkpoint_not_a_crash(tmp_path: Path, version: int) -> None:
    older, newer = legacy_pair(tmp_path) if version == 1 else write(tmp_path, [10, 20])
    data = next(p for p in newer.iterdir() if p.suffix in (".distcp", ".bin"))
    # Zeros where the tensors were: torch.load (version 1) or the chunk check (3) fails
    # inside DCP, which raises its CheckpointException, a BaseException.
    replace_and_rehash(newer, data.name, b"\x00" * data.stat().st_size)

    with pytest.raises(CheckpointCorrupt, match="could not load the tensors"):
        load(newer)
    loaded = CheckpointReader(tmp_path).load_latest_valid()
    assert loaded is not None and loaded.path == older


def test_tensor_index_pointing_outside_the_chain_is_refused(tmp_path: Path) -> None:
    first, second = write(tmp_path, [10, 20])
    index = (second / TENSORS_FILE).read_bytes().replace(second.name.encode(), first.name.encode())
    replace_and_rehash(second, TENSORS_FILE, index)
    with pytest.raises(CheckpointCorrupt, match=f"refers to {first.name}, which is not in its chain"):
        load(second)


def test_version_1_checkpoint_loads_bitwise(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    expected = json.loads((FIXTURE / "expected.json").read_text())
    shutil.copytree(FIXTURE, tmp_path / "old")

    loaded = CheckpointReader(tmp_path / "old").load_latest_valid()

    assert loaded is not None and loaded.step == expected["step"] and loaded.lineage == LEGACY_LINEAGE
    assert release_digest(flatten(loaded.state)) == expected["digest"]
    assert main(["verify", str(tmp_path / "old" / "step-000000003")]) == 0
    assert capsys.readouterr().out.startswith("valid: step-000000003: 3 files")


def test_previous_release_checkpoint_loads_bitwise_and_the_next_save_continues_its_lineage(tmp_path: Path) -> None:
    fixture = FIXTURES / "checkpoint_v2"
    expected = json.loads((fixture / "expected.json").read_text())
    shutil.copytree(fixture, tmp_path / "old")

    loaded = CheckpointReader(tmp_path / "old").load_latest_valid()
    assert loaded is not None and (loaded.step, loaded.lineage) == (expected["step"], expected["lineage"])
    assert release_digest(flatten(loaded.state)) == expected["digest"]

    # The next save builds on nothing it cannot chunk: a full base of this release's format,
    # in the same lineage, and the older checkpoint stays readable beside it.
    with CheckpointWriter(tmp_path / "old", keep_last=10) as writer:
        snap = Snapshot.capture(flatten(loaded.state), step=6, quorum_id=1, replica_id="g0")
        result = writer.save_async(snap, 6, lineage=loaded.lineage).wait(60)
    assert result.ok and result.kind == "base", result.reason
    assert json.loads((result.path / MANIFEST_FILE).read_text())["version"] == FORMAT_VERSION
    newer = CheckpointReader(tmp_path / "old").load_latest_valid()
    assert newer is not None and (newer.step, newer.lineage) == (6, expected["lineage"])
    assert release_digest(flatten(newer.state)) == expected["digest"]
    assert digest(flatten(newer.state)) == digest(flatten(loaded.state))


def test_a_previous_release_checkpoint_of_the_same_step_is_replaced_saying_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its digest is of the older scheme (state.DIGEST_SCHEME), so equal states have unequal
    digests: the save must neither keep it as "this very save" nor call it another history."""
    fixture = FIXTURES / "checkpoint_v2"
    expected = json.loads((fixture / "expected.json").read_text())
    shutil.copytree(fixture, tmp_path / "old")
    loaded = CheckpointReader(tmp_path / "old").load_latest_valid()
    assert loaded is not None
    caplog.set_level(logging.INFO, logger="replicaft")
    with CheckpointWriter(tmp_path / "old", keep_last=10) as writer:
        snap = Snapshot.capture(flatten(loaded.state), step=expected["step"], quorum_id=1, replica_id="g0")
        result = writer.save_async(snap, expected["step"], lineage=loaded.lineage).wait(60)
    assert result.ok and result.path is not None and "already published" not in result.reason, result.reason
    assert "an older release wrote it, with another kind of state digest" in caplog.text
    assert "another state of step" not in caplog.text
    assert json.loads((result.path / MANIFEST_FILE).read_text())["metadata"]["digest"] == digest(flatten(loaded.state))
