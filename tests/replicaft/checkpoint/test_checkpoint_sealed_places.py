"""An encrypted checkpoint's sealed pieces open only where they were sealed for (issue 37, bug 4).

Without the key, swapping two tensors' chunk references in the readable ``tensors.msgpack``
loaded the two tensors swapped, and step 100's ``state.msgpack`` in step 200's directory
resumed "step 200" with step 100's counters. Each attack below is made on real checkpoints
written by the real writer, by one who can write the files but has no key: the file is
changed and its manifest entry re-hashed (``replace_and_rehash``). Each is refused naming both
places, and resume falls back to the intact checkpoint before it.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import msgpack
import pytest
import torch
from conftest import REPO_ROOT
from test_checkpoint_legacy import replace_and_rehash

from replicaft.checkpoint import CheckpointReader, CheckpointWriter
from replicaft.checkpoint.keys import EncryptionKey
from replicaft.checkpoint.layout import MANIFEST_FILE, STATE_FILE, TENSORS_FILE, pack_name
from replicaft.checkpoint.manifest import FORMAT_VERSION
from replicaft.errors import CheckpointCorrupt
from replicaft.state.content import CHUNK_BYTES
from replicaft.state.flat import digest, flatten
from replicaft.transfer.snapshot import Snapshot

KEY = EncryptionKey.from_bytes(bytes(range(32)))
LINEAGE = "0123456789ab"
V3_FIXTURE = REPO_ROOT / "tests" / "replicaft" / "checkpoint" / "fixtures" / "checkpoint_v3_encrypted"
"""Written by the release before this change (format version 3, encrypted under KEY)."""


def state(step: int, big: torch.Tensor | None = None) -> dict[str, object]:
    model = {"w": torch.full((64,), float(step)), "b": torch.full((64,), -float(step)), "frozen": torch.ones(16)}
    if big is not None:
        model["big"] = big
    return {"replicaft": {"step": step}, "cursor": {"batch": 10 * step}, "model": model}


def write(directory: Path, steps: list[int], big: torch.Tensor | None = None, **options: object) -> list[Path]:
    paths = []
    with CheckpointWriter(directory, encryption_key=KEY, keep_last=10, lineage=LINEAGE, **options) as writer:
        for step in steps:
            snap = Snapshot.capture(flatten(state(step, big)), step=step, quorum_id=1, replica_id="g0")
            result = writer.save_async(snap, step).wait(60)
            assert result.ok and result.path is not None, result.reason
            paths.append(result.path)
    return paths


def index_of(checkpoint: Path) -> dict:
    return msgpack.unpackb((checkpoint / TENSORS_FILE).read_bytes(), raw=False)


def refs_of(index: dict, name: str) -> list:
    """The chunk references of state tensor ``name`` (its DCP key is ``state.<name>``)."""
    (stored,) = [s for s in index["stored"] if s[0] == f"state.{name}"]
    return stored[5]


def stored_at(index: dict, name: str) -> list:
    """``refs_of`` with each reference's location by name (its number is per index)."""
    return [[index["locations"][r[0]], *r[1:]] for r in refs_of(index, name)]


def rewrite_index(checkpoint: Path, index: dict) -> None:
    replace_and_rehash(checkpoint, TENSORS_FILE, msgpack.packb(index, use_bin_type=True))


def assert_falls_back_to(directory: Path, step: int, caplog: pytest.LogCaptureFixture, *said: str) -> None:
    """Resume skips the attacked checkpoint, saying why (``said``), and loads ``step`` intact."""
    with caplog.at_level(logging.WARNING, logger="replicaft.checkpoint"):
        loaded = CheckpointReader(directory, encryption_key=KEY).load_latest_valid()
    assert loaded is not None and loaded.step == step
    assert digest(flatten(loaded.state)) == digest(flatten(state(step)))
    skipped = [r.getMessage() for r in caplog.records if "skipping step" in r.getMessage()]
    assert skipped and all(s in skipped[0] for s in said), skipped


def test_swapped_chunk_references_of_two_tensors_are_refused_naming_both(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, newer = write(tmp_path, [100, 200], chain_length=1)
    index = index_of(newer)
    w, b = refs_of(index, "model.w"), refs_of(index, "model.b")
    w[:], b[:] = list(b), list(w)
    rewrite_index(newer, index)

    swapped = r"sealed as tensor state\.model\.(w|b) .* found as tensor state\.model\.(b|w)"
    with pytest.raises(CheckpointCorrupt, match=swapped) as e:
        CheckpointReader(tmp_path, encryption_key=KEY).load(newer)
    assert "model.w" in str(e.value) and "model.b" in str(e.value)
    assert_falls_back_to(tmp_path, 100, caplog, "model.w", "model.b")


def test_state_of_another_step_is_refused_naming_both_steps(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    older, newer = write(tmp_path, [100, 200], chain_length=1)
    replace_and_rehash(newer, STATE_FILE, (older / STATE_FILE).read_bytes())

    with pytest.raises(
        CheckpointCorrupt,
        match=f"sealed as the state of step 100 of lineage {LINEAGE}, but was found as the state of "
        f"step 200 of lineage {LINEAGE}",
    ):
        CheckpointReader(tmp_path, encryption_key=KEY).load(newer)
    assert_falls_back_to(tmp_path, 100, caplog, "step 100", "step 200")


def test_the_index_of_an_earlier_checkpoint_of_the_chain_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Step 100's index in step 200's directory, 200 an increment on 100: every chunk it refers
    to is in 200's chain and opens where it is, so only the state's binding of its index
    (StateLayout.index_sha256) tells that step 100's tensors would load under step 200's state."""
    older, newer = write(tmp_path, [100, 200], chain_length=4)
    assert json.loads((newer / MANIFEST_FILE).read_text())["requires"] == [older.name]
    replace_and_rehash(newer, TENSORS_FILE, (older / TENSORS_FILE).read_bytes())

    with pytest.raises(CheckpointCorrupt, match="the state of step 200 was saved with the index of SHA-256"):
        CheckpointReader(tmp_path, encryption_key=KEY).load(newer)
    assert_falls_back_to(tmp_path, 100, caplog, f"{newer.name}/{TENSORS_FILE}", "copied in")


def test_a_chunk_moved_to_another_offset_of_its_pack_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, newer = write(tmp_path, [100, 200], chain_length=1)
    index = index_of(newer)
    (ref,) = refs_of(index, "model.w")
    _, rank, offset, stored_len = ref[:4]
    pack = (newer / pack_name(rank)).read_bytes()
    ref[2] = len(pack)  # the same record, appended: the index points at the copy
    replace_and_rehash(newer, pack_name(rank), pack + pack[offset : offset + stored_len])
    rewrite_index(newer, index)

    with pytest.raises(CheckpointCorrupt, match=f"stored in pack-0.bin@{offset}, but was found as .*@{len(pack)}"):
        CheckpointReader(tmp_path, encryption_key=KEY).load(newer)
    assert_falls_back_to(tmp_path, 100, caplog, f"@{offset}", f"@{len(pack)}")


def test_two_chunks_of_one_tensor_swapped_are_refused(tmp_path: Path) -> None:
    big = torch.arange(2 * CHUNK_BYTES // 4, dtype=torch.float32)  # two chunks of 4 MiB
    (path,) = write(tmp_path, [100], big)
    index = index_of(path)
    chunks = refs_of(index, "model.big")
    chunks.reverse()
    rewrite_index(path, index)
    moved = f"sealed as tensor state.model.big bytes {CHUNK_BYTES}.. .*found as tensor state.model.big bytes 0.."
    with pytest.raises(CheckpointCorrupt, match=moved):
        CheckpointReader(tmp_path, encryption_key=KEY).load(path)


def test_an_encrypted_increment_reuses_unchanged_tensors_and_equal_chunks_load_where_they_are(
    tmp_path: Path,
) -> None:
    """Reuse is by place as well as id: the unchanged tensor of an increment refers to its
    parent's chunks, and a tensor whose two chunks are equal (zeros) is written twice and
    loads, each sealed for its own offset."""
    zeros = torch.zeros(2 * CHUNK_BYTES // 4)
    base, increment = write(tmp_path, [10, 20], zeros)
    assert json.loads((increment / MANIFEST_FILE).read_text())["requires"] == [base.name]
    first, second = stored_at(index_of(base), "model.big")
    assert first[5] == second[5] and first[2] != second[2]  # same id, each stored for its offset
    assert stored_at(index_of(increment), "model.big") == [first, second]  # both in the base's pack
    loaded = CheckpointReader(tmp_path, encryption_key=KEY).load_latest_valid()
    assert loaded is not None and loaded.step == 20
    assert digest(flatten(loaded.state)) == digest(flatten(state(20, zeros)))


def test_previous_format_encrypted_checkpoint_loads_and_the_next_save_is_a_sealed_base(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    expected = json.loads((V3_FIXTURE / "expected.json").read_text())
    shutil.copytree(V3_FIXTURE, tmp_path / "old")
    reader = CheckpointReader(tmp_path / "old", encryption_key=EncryptionKey.from_bytes(bytes.fromhex(expected["key"])))
    with caplog.at_level(logging.WARNING, logger="replicaft.checkpoint"):
        loaded = reader.load_latest_valid()
    assert loaded is not None and (loaded.step, loaded.lineage) == (expected["step"], expected["lineage"])
    assert digest(flatten(loaded.state)) == expected["digest"]
    assert any("not bound to their places" in r.getMessage() for r in caplog.records)

    with CheckpointWriter(tmp_path / "old", encryption_key=KEY, keep_last=10) as writer:
        snap = Snapshot.capture(flatten(loaded.state), step=8, quorum_id=1, replica_id="g0")
        result = writer.save_async(snap, 8, lineage=loaded.lineage).wait(60)
    assert result.ok and result.kind == "base" and result.path is not None, result.reason
    assert json.loads((result.path / MANIFEST_FILE).read_text())["version"] == FORMAT_VERSION
    newer = reader.load_latest_valid()
    assert newer is not None and newer.step == 8 and digest(flatten(newer.state)) == expected["digest"]


def test_a_previous_format_piece_in_a_new_checkpoint_is_refused(tmp_path: Path) -> None:
    """A version-3 piece says nothing of its place, so it cannot stand in a version-4 checkpoint."""
    (path,) = write(tmp_path, [7])
    (old,) = V3_FIXTURE.glob("step-*")
    replace_and_rehash(path, STATE_FILE, (old / STATE_FILE).read_bytes())
    with pytest.raises(CheckpointCorrupt, match="does not say what it is"):
        CheckpointReader(tmp_path, encryption_key=KEY).load(path)
