"""Disk faults on the checkpoint directory: a small tmpfs to fill, and a flipped byte in a shard.

* ``fill_disk`` must not fill the machine's real disk (it is shared, and a full root file
  system takes down more than the run), so a run with that fault gets a small tmpfs mounted as
  its checkpoint directory for its whole length (``mount -t tmpfs``, root only); the fault
  writes a filler file until ENOSPC and deletes it when the duration is over. Where the mount
  is refused, the fault is skipped with the reason, never simulated.
* ``corrupt_checkpoint`` flips one byte in the middle of the first chunk pack (``pack-*.bin``;
  ``*.distcp`` in the previous release's format; the tensor index when an increment wrote no
  pack) of the
  newest *published* checkpoint (``step-NNNNNNNNN-<lineage>/``; temporary ``*.tmp-*`` directories are not
  checkpoints). The harness does it while every group is down, so no writer races it.

The directory names mirror ``replicaft/checkpoint/layout.py`` (its regex is repeated here so the
harness does not import torch through the ``replicaft.checkpoint`` package).
"""

from __future__ import annotations

import errno
import logging
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

TMPFS_MB = 32
"""Size of the checkpoint tmpfs: a few checkpoints of the example's models, small enough to fill in ms."""
COMMAND_TIMEOUT_S = 10.0
FILLER_NAME = "chaos-filler.bin"
_PUBLISHED = re.compile(r"step-(\d{9,})(?:-[0-9a-f]{12})?")


class DiskUnavailable(RuntimeError):
    """The tmpfs cannot be mounted (not root, no ``mount``), or a disk fault cannot be applied."""


@dataclass(frozen=True, slots=True)
class Corruption:
    step: int
    """The checkpoint that was damaged."""
    path: Path
    """The shard file."""
    offset: int


def published_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every published checkpoint in ``directory``, newest first."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _PUBLISHED.fullmatch(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


def flip_byte(path: Path) -> int:
    """Invert the byte in the middle of ``path``; returns its offset. Raises DiskUnavailable on an empty file."""
    size = path.stat().st_size
    if size == 0:
        raise DiskUnavailable(f"{path} is empty; there is no byte to flip")
    offset = size // 2
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    return offset


def corrupt_newest_checkpoint(directory: Path) -> Corruption:
    """Flip a byte in the first data file of the newest published checkpoint."""
    found = published_checkpoints(directory)
    if not found:
        raise DiskUnavailable(f"no published checkpoint in {directory} to corrupt")
    step, path = found[0]
    shards = sorted(path.glob("pack-*.bin")) or sorted(path.glob("*.distcp")) or sorted(path.glob("tensors.msgpack"))
    if not shards:
        raise DiskUnavailable(f"{path} has no data file to corrupt")
    offset = flip_byte(shards[0])
    logger.info("corrupted %s at byte %d (checkpoint of step %d)", shards[0], offset, step)
    return Corruption(step, shards[0], offset)


def _run(*cmd: str) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DiskUnavailable(f"`{' '.join(cmd)}` could not run: {e}") from e
    if done.returncode != 0:
        raise DiskUnavailable(f"`{' '.join(cmd)}` failed (exit {done.returncode}): {done.stderr.strip()}")


class SmallDisk:
    """A tmpfs of ``size_mb`` mounted at ``path`` for one run; ``fill()`` / ``unfill()`` are the fault."""

    def __init__(self, path: Path, size_mb: int = TMPFS_MB) -> None:
        self.path = path
        self.size_mb = size_mb
        self._mounted = False

    def mount(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        _run("mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m,mode=0755", "tmpfs", str(self.path))
        self._mounted = True
        logger.info("mounted a %d MiB tmpfs at %s", self.size_mb, self.path)

    def fill(self) -> int:
        """Write a filler file until the file system is full; returns its size in bytes."""
        written = 0
        with open(self.path / FILLER_NAME, "wb", buffering=0) as f:
            for chunk in (1 << 20, 1 << 12, 1):
                block = b"\0" * chunk
                while True:
                    try:
                        written += f.write(block)
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            raise
                        break
        logger.info("filled %s with %d bytes", self.path, written)
        return written

    def unfill(self) -> None:
        (self.path / FILLER_NAME).unlink(missing_ok=True)

    def unmount(self) -> None:
        if not self._mounted:
            return
        self._mounted = False
        try:
            _run("umount", str(self.path))
        except DiskUnavailable as e:
            logger.warning("%s; detaching it lazily", e)
            _run("umount", "-l", str(self.path))
