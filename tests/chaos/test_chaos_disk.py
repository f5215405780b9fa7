"""Disk faults (chaos/disk.py): the newest published checkpoint is found and damaged in one shard
byte, temporary directories are never taken for checkpoints, and the small tmpfs fills up and
frees (mounted for real where root may, else skipped)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from chaos.disk import (
    DiskUnavailable,
    SmallDisk,
    corrupt_newest_checkpoint,
    flip_byte,
    published_checkpoints,
)


def fake_checkpoint(root: Path, name: str, shards: int = 2) -> Path:
    path = root / name
    path.mkdir(parents=True)
    for i in range(shards):
        (path / f"__{i}_0.distcp").write_bytes(bytes(range(10)))
    (path / "manifest.json").write_text("{}")
    return path


def test_published_checkpoints_newest_first_without_temporary_ones(tmp_path: Path) -> None:
    fake_checkpoint(tmp_path, "step-000000010")
    fake_checkpoint(tmp_path, "step-000000020")
    fake_checkpoint(tmp_path, "step-000000030.tmp-ab12")
    (tmp_path / "step-000000040").write_text("a file, not a checkpoint")
    assert [step for step, _ in published_checkpoints(tmp_path)] == [20, 10]
    assert published_checkpoints(tmp_path / "missing") == []


def test_corruption_flips_one_byte_of_the_newest_first_shard(tmp_path: Path) -> None:
    fake_checkpoint(tmp_path, "step-000000010")
    newest = fake_checkpoint(tmp_path, "step-000000020")
    damage = corrupt_newest_checkpoint(tmp_path)
    assert (damage.step, damage.path, damage.offset) == (20, newest / "__0_0.distcp", 5)
    data = damage.path.read_bytes()
    assert data[5] == 5 ^ 0xFF and data[:5] + data[6:] == bytes(range(5)) + bytes(range(6, 10))
    assert (newest / "__1_0.distcp").read_bytes() == bytes(range(10))
    assert (tmp_path / "step-000000010" / "__0_0.distcp").read_bytes() == bytes(range(10))


def test_nothing_to_corrupt_is_an_error_naming_the_directory(tmp_path: Path) -> None:
    with pytest.raises(DiskUnavailable, match="no published checkpoint"):
        corrupt_newest_checkpoint(tmp_path)
    fake_checkpoint(tmp_path, "step-000000010", shards=0)
    with pytest.raises(DiskUnavailable, match="has no data file"):
        corrupt_newest_checkpoint(tmp_path)
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises(DiskUnavailable, match="empty"):
        flip_byte(tmp_path / "empty")


@pytest.mark.timeout(30)
def test_small_disk_fills_to_enospc_and_frees(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    disk = SmallDisk(tmp_path / "ckpt", size_mb=2)
    try:
        disk.mount()
    except DiskUnavailable as e:
        pytest.skip(f"cannot mount a tmpfs here: {e}")
    try:
        assert disk.fill() > 1_500_000
        assert shutil.disk_usage(disk.path).free < 4096
        with pytest.raises(OSError):
            (disk.path / "more").write_bytes(b"x" * 8192)
        disk.unfill()
        assert shutil.disk_usage(disk.path).free > 1_500_000
    finally:
        disk.unmount()
    assert not os.path.ismount(disk.path)
