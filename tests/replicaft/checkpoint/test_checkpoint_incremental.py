"""Incremental saves, chains, compression and encryption on a real disk (issue 22).

chain.py and retention.py decide; storage.py writes chunks; these tests save and load real
checkpoints and damage real files.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
import torch

from replicaft.checkpoint import CheckpointReader, CheckpointWriter, SaveResult
from replicaft.checkpoint.chain import Parent, decide_chain
from replicaft.checkpoint.keys import (
    KEY_ENV,
    KEY_FILE_ENV,
    EncryptionKey,
    key_from_env,
    load_key,
    parse_key,
)
from replicaft.checkpoint.layout import MANIFEST_FILE
from replicaft.checkpoint.options import RetentionPolicy
from replicaft.checkpoint.retention import CheckpointFacts, decide_retention
from replicaft.errors import CheckpointKeyError, OptionsError
from replicaft.state.content import CHUNK_BYTES
from replicaft.state.flat import digest, flatten
from replicaft.transfer.snapshot import Snapshot

FROZEN = torch.arange(3 * CHUNK_BYTES // 4, dtype=torch.float32)  # 12 MiB: three chunks


def state(step: int, frozen: torch.Tensor = FROZEN) -> dict[str, object]:
    return {"replicaft": {"step": step}, "model": {"embedding": frozen, "head": torch.full((1000,), float(step))}}


def save(writer: CheckpointWriter, step: int, frozen: torch.Tensor = FROZEN) -> SaveResult:
    snap = Snapshot.capture(flatten(state(step, frozen)), step=step, quorum_id=1, replica_id="g0")
    result = writer.save_async(snap, step).wait(60)
    assert result.ok, result.reason
    return result


def manifest(result: SaveResult) -> dict[str, object]:
    assert result.path is not None
    return json.loads((result.path / MANIFEST_FILE).read_text())


# -- pure rules ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parent", "chain_length", "key_id", "kind", "reason"),
    [
        (None, 10, None, "base", "no earlier checkpoint of this lineage"),
        (Parent("p", 3, None, True), 1, None, "base", "incremental saves are off"),
        (Parent("p", 3, None, True), 10, None, "increment", "increment 4 of 10 on p"),
        (Parent("p", 10, None, True), 10, None, "base", "p ends a chain of 10"),
        (
            Parent("p", 2, None, False, "p/pack-0.bin is missing"),
            10,
            None,
            "base",
            "p cannot be built on: p/pack-0.bin is missing",
        ),
        (Parent("p", 2, "aaaa", True), 10, "bbbb", "base", "encrypted under key aaaa, this save under bbbb"),
    ],
)
def test_decide_chain_table(
    parent: Parent | None, chain_length: int, key_id: str | None, kind: str, reason: str
) -> None:
    decision = decide_chain(parent, chain_length=chain_length, key_id=key_id)
    assert decision.kind == kind and reason in decision.reason
    assert (decision.parent is None) == (kind == "base")


@pytest.mark.parametrize(
    ("steps", "requires", "keep_last", "deleted"),
    [
        ([10, 20, 30], {30: [10]}, 1, [20]),  # 30 builds on 10: 10 stays while 30 does
        ([10, 20, 30, 40], {20: [10], 30: [10, 20], 40: []}, 1, [10, 20, 30]),  # a new base frees the old chain
        ([10, 20, 30], {30: [10, 20]}, 2, []),
    ],
)
def test_retention_keeps_the_chains_of_kept_checkpoints(
    steps: list[int], requires: dict[int, list[int]], keep_last: int, deleted: list[int]
) -> None:
    facts = [CheckpointFacts(s, requires=tuple(requires.get(s, ()))) for s in steps]
    decision = decide_retention(facts, RetentionPolicy(keep_last=keep_last))
    assert list(decision.delete) == deleted


# -- incremental ---------------------------------------------------------------------------


def test_increment_writes_only_what_changed_and_restores_bitwise(tmp_path: Path) -> None:
    with CheckpointWriter(tmp_path, keep_last=5) as writer:
        base, increment = save(writer, 10), save(writer, 20)
    assert (base.kind, increment.kind) == ("base", "increment")
    assert base.num_bytes > FROZEN.numel() * 4 and increment.num_bytes < 64 * 1024
    assert base.path is not None and manifest(increment)["requires"] == [base.path.name]

    loaded = CheckpointReader(tmp_path).load_latest_valid()
    assert loaded is not None and loaded.step == 20
    assert digest(flatten(loaded.state)) == digest(flatten(state(20)))


def test_one_changed_chunk_of_a_large_tensor_is_all_that_is_written(tmp_path: Path) -> None:
    changed = FROZEN.clone()
    changed[-1] = -1.0  # the last of three chunks
    with CheckpointWriter(tmp_path) as writer:
        save(writer, 10)
        increment = save(writer, 20, changed)
    assert CHUNK_BYTES < increment.num_bytes < CHUNK_BYTES + 64 * 1024
    loaded = CheckpointReader(tmp_path).load_latest_valid()
    assert loaded is not None and loaded.state["model"]["embedding"].equal(changed)


def test_a_full_base_every_chain_length_saves(tmp_path: Path) -> None:
    with CheckpointWriter(tmp_path, chain_length=3, keep_last=10) as writer:
        kinds = [save(writer, step).kind for step in (10, 20, 30, 40, 50)]
    assert kinds == ["base", "increment", "increment", "base", "increment"]


def test_damaged_base_falls_back_to_the_newest_complete_chain_never_a_mixed_one(tmp_path: Path) -> None:
    with CheckpointWriter(tmp_path, chain_length=2, keep_last=10) as writer:
        results = [save(writer, step) for step in (10, 20, 30, 40)]
    assert [r.kind for r in results] == ["base", "increment", "base", "increment"]
    base30 = results[2].path
    assert base30 is not None
    with open(base30 / "pack-0.bin", "r+b") as f:
        f.seek(100)
        f.write(b"\xff")

    ok, why = CheckpointReader.verify(results[3].path)  # type: ignore[arg-type]
    assert not ok and f"builds on {base30.name}, which is not intact: {base30.name}/pack-0.bin checksum mismatch" in why
    loaded = CheckpointReader(tmp_path).load_latest_valid()
    assert loaded is not None and loaded.step == 20
    assert digest(flatten(loaded.state)) == digest(flatten(state(20)))


def test_retention_deletes_old_checkpoints_but_not_a_base_an_increment_needs(tmp_path: Path) -> None:
    with CheckpointWriter(tmp_path, keep_last=1, chain_length=3) as writer:
        for step in (10, 20, 30):
            save(writer, step)
        listed = [i.step for i in CheckpointReader(tmp_path).list(verify_files=False)]
        assert listed == [30, 10]  # 30 refers to 10's frozen chunks; 20 is needed by nobody
        save(writer, 40)  # a new base: the old chain goes
    assert [i.step for i in CheckpointReader(tmp_path).list()] == [40]


def test_tier2_receives_the_chain_and_restores_when_tier1_is_lost(tmp_path: Path) -> None:
    with CheckpointWriter(tmp_path / "t1", tier2_directory=tmp_path / "t2", keep_last=1) as writer:
        save(writer, 10)
        increment = save(writer, 20)
    assert increment.kind == "increment" and increment.tier2_error is None
    for path in (tmp_path / "t1").glob("step-*"):  # the checkpoints; the catalog may sit beside them
        for f in path.iterdir():
            f.unlink()
    loaded = CheckpointReader(tmp_path / "t1", tier2_directory=tmp_path / "t2").load_latest_valid()
    assert loaded is not None and loaded.step == 20 and digest(flatten(loaded.state)) == digest(flatten(state(20)))


# -- compression and encryption --------------------------------------------------------------


def test_compression_shrinks_compressible_chunks_and_restores_bitwise(tmp_path: Path) -> None:
    zeros = torch.zeros_like(FROZEN)
    with CheckpointWriter(tmp_path / "plain") as writer:
        plain = save(writer, 10, zeros)
    with CheckpointWriter(tmp_path / "zstd", compression_level=3) as writer:
        packed = save(writer, 10, zeros)
    assert packed.num_bytes * 20 < plain.num_bytes
    assert manifest(packed)["codec"] == {"compression_level": 3, "key_id": None}
    loaded = CheckpointReader(tmp_path / "zstd").load_latest_valid()
    assert loaded is not None and loaded.state["model"]["embedding"].equal(zeros)


KEY = EncryptionKey.from_bytes(bytes(range(32)))
OTHER_KEY = EncryptionKey.from_bytes(bytes(range(1, 33)))


def test_encrypted_checkpoint_holds_no_plaintext_and_loads_only_with_its_key(tmp_path: Path) -> None:
    marker = torch.tensor([float(0x5EC2E7)] * 4096)
    with CheckpointWriter(tmp_path, encryption_key=KEY, chain_length=1) as writer:
        snap = Snapshot.capture(
            flatten({"model": {"w": marker}, "cursor": {"secret": "swordfish"}}), step=5, quorum_id=1, replica_id="g0"
        )
        result = writer.save_async(snap, 5).wait(60)
    assert result.ok and result.path is not None
    everything = b"".join(f.read_bytes() for f in result.path.iterdir() if f.name != MANIFEST_FILE)
    assert marker.numpy().tobytes()[:64] not in everything and b"swordfish" not in everything
    assert manifest(result)["codec"] == {"compression_level": 0, "key_id": KEY.key_id}

    assert CheckpointReader.verify(result.path)[0]  # integrity needs no key
    loaded = CheckpointReader(tmp_path, encryption_key=KEY).load_latest_valid()
    assert (
        loaded is not None
        and loaded.state["model"]["w"].equal(marker)
        and loaded.state["cursor"]["secret"] == "swordfish"
    )
    with pytest.raises(CheckpointKeyError, match=f"is encrypted \\(key id {KEY.key_id}\\) and no key was given"):
        CheckpointReader(tmp_path).load_latest_valid()
    with pytest.raises(CheckpointKeyError, match=f"key id {KEY.key_id}, but the key given has id {OTHER_KEY.key_id}"):
        CheckpointReader(tmp_path, encryption_key=OTHER_KEY).load_latest_valid()


def test_compressed_and_encrypted_checkpoint_loads(tmp_path: Path) -> None:
    """Both at once: the whole-file state was compressed as well as encrypted, which the reader
    refused, so every such checkpoint was skipped and the job started from nothing."""
    zeros = torch.zeros_like(FROZEN)
    with CheckpointWriter(tmp_path, compression_level=3, encryption_key=KEY) as writer:
        packed = save(writer, 10, zeros)
    assert manifest(packed)["codec"] == {"compression_level": 3, "key_id": KEY.key_id}
    loaded = CheckpointReader(tmp_path, encryption_key=KEY).load_latest_valid()
    assert loaded is not None and loaded.step == 10 and loaded.state["model"]["embedding"].equal(zeros)


def test_a_new_key_starts_a_new_chain(tmp_path: Path) -> None:
    with CheckpointWriter(tmp_path, encryption_key=KEY, keep_last=5, lineage="aaaaaaaaaaaa") as writer:
        save(writer, 10)
    with CheckpointWriter(tmp_path, encryption_key=OTHER_KEY, keep_last=5, lineage="aaaaaaaaaaaa") as writer:
        assert save(writer, 20).kind == "base"


@pytest.mark.parametrize(
    "text",
    [bytes(range(32)).hex(), base64.b64encode(bytes(range(32))).decode(), bytes(range(32)).hex().upper() + "\n"],
    ids=["hex", "base64", "hex_upper_newline"],
)
def test_key_formats_parse_to_the_same_key(text: str) -> None:
    assert parse_key(text, "test").key_id == KEY.key_id


def test_key_from_file_or_variable_and_the_refusals(tmp_path: Path) -> None:
    key_file = tmp_path / "secret" / "ckpt.key"
    key_file.parent.mkdir()
    key_file.write_bytes(bytes(range(32)))
    assert load_key(key_file=key_file).key_id == KEY.key_id  # type: ignore[union-attr]
    assert key_from_env({KEY_ENV: bytes(range(32)).hex()}).key_id == KEY.key_id  # type: ignore[union-attr]
    assert key_from_env({}) is None
    with pytest.raises(OptionsError, match=f"{KEY_ENV} is not a checkpoint key"):
        key_from_env({KEY_ENV: "too short"})
    with pytest.raises(OptionsError, match=f"both a checkpoint key file \\({KEY_FILE_ENV}\\) and a key"):
        key_from_env({KEY_ENV: "x", KEY_FILE_ENV: str(key_file)})
    inside = tmp_path / "ckpt" / "key"
    inside.parent.mkdir()
    inside.write_bytes(bytes(range(32)))
    with pytest.raises(OptionsError, match="is inside the checkpoint directory"):
        load_key(key_file=inside, data_directories=(tmp_path / "ckpt",))
    os.chmod(key_file, 0)
    if os.geteuid() != 0:  # root reads anything
        with pytest.raises(OptionsError, match="the checkpoint key file .* cannot be opened"):
            load_key(key_file=key_file)
