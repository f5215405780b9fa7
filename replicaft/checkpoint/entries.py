"""Judging what a checkpoint directory holds, without following links blindly or blocking.

A checkpoint directory is read by every restarting group, by ``replicaft-ckpt`` and by the
startup check, and it may hold anything an operator, a crashed tool or an attacker left
there: a symbolic link named like a checkpoint (dangling, or looping back on itself), a
FIFO or a device in place of ``manifest.json``, a file of many gigabytes. Following a link
with ``stat`` raised out of the listing (the group then trained from step 0 beside the
history it should have resumed); ``open`` on a FIFO blocks until a writer appears, which
is never. So every entry is judged by ``lstat`` first, and every file is opened with
``O_NOFOLLOW | O_NONBLOCK`` and checked with ``fstat`` to be a regular file before a byte
is read. An entry that is not what a checkpoint is made of is *skipped with a reason*,
never an exception out of a listing.

Rejected alternative: resolving links and accepting those that point at a checkpoint. A
link makes one checkpoint appear under two names (or in two histories), and a writer that
publishes by ``rename`` and deletes by ``rmtree`` would act on the target of a link it did
not create. Checkpoints are real directories; a link is reported and left alone.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from replicaft.errors import CheckpointCorrupt

MAX_SMALL_FILE_BYTES = 256 * 1024 * 1024
"""Upper bound for a metadata file read whole (manifest, state layout, tensor index): far
above any real one (a 100 GB state's tensor index is a few MB), far below memory."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One name in a directory, judged by ``lstat`` (never following a link)."""

    path: Path
    kind: str
    """"dir", "file", "symlink", "fifo", "socket", "device", "missing" or "other"."""

    @property
    def is_dir(self) -> bool:
        return self.kind == "dir"


def kind_of(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "other"


def judge(path: Path) -> Entry:
    """What ``path`` is, without following it; "missing" if it vanished meanwhile."""
    try:
        return Entry(path, kind_of(os.lstat(path).st_mode))
    except FileNotFoundError:
        return Entry(path, "missing")


def scan(directory: Path) -> list[Entry]:
    """Every entry of ``directory``, judged; [] if it does not exist or is not a directory.

    Raises CheckpointCorrupt only when ``directory`` exists as a directory and cannot be
    listed (permissions, I/O error): that is not "no checkpoints" and must not read as it.
    """
    top = judge(directory)
    if top.kind == "symlink":
        # The directory the operator named may be a link (a mount point's alias); its
        # *contents* are judged without following.
        try:
            if not directory.is_dir():
                return []
        except OSError:
            return []
    elif not top.is_dir:
        return []
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    except OSError as e:
        raise CheckpointCorrupt(f"cannot list the checkpoint directory {directory} ({e})") from e
    return [judge(directory / name) for name in names]


CHECKPOINT_RULE = "a checkpoint holds only regular files"


def open_regular(path: Path, where: str, *, follow_links: bool = False, rule: str = CHECKPOINT_RULE) -> BinaryIO:
    """Open ``path`` for reading only if it is a regular file; never blocks, and never follows
    a link unless ``follow_links`` (an operator's own file: a mounted secret is a link).

    Raises CheckpointCorrupt naming ``where`` for a missing file, a link, a FIFO, a device
    or a directory (what it found instead, and ``rule``: why only a regular file will do).
    The caller closes the file (use it in a ``with``).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise CheckpointCorrupt(f"{where} is missing") from None
    except OSError as e:
        try:
            found = kind_of((os.stat if follow_links else os.lstat)(path).st_mode)
        except OSError:
            found = "file"  # cannot even be looked at: the open's own error says why
        if found != "file":
            raise CheckpointCorrupt(f"{where} is a {found}, not a regular file; {rule}") from e
        raise CheckpointCorrupt(f"{where} cannot be opened ({e})") from e
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise CheckpointCorrupt(f"{where} is a {kind_of(mode)}, not a regular file; {rule}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_small(
    path: Path,
    where: str,
    max_bytes: int = MAX_SMALL_FILE_BYTES,
    *,
    follow_links: bool = False,
    rule: str = CHECKPOINT_RULE,
) -> bytes:
    """The whole of regular file ``path`` if it holds at most ``max_bytes``; else CheckpointCorrupt
    (``follow_links`` and ``rule`` as for :func:`open_regular`)."""
    with open_regular(path, where, follow_links=follow_links, rule=rule) as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise CheckpointCorrupt(f"{where} is {size} bytes, more than the {max_bytes} such a file can hold")
        try:
            # size + 1, not max_bytes + 1: read(n) allocates n bytes up front, and 256 MiB for
            # every manifest read fails where memory is capped (issue 19).
            data = f.read(size + 1)
        except OSError as e:
            raise CheckpointCorrupt(f"{where} cannot be read ({e})") from e
    if len(data) > size:
        raise CheckpointCorrupt(
            f"{where} grew past {size} bytes while being read; a published checkpoint's "
            "files never change (is another process writing it?)"
        )
    return data
