"""Durable file operations: checksum and fsync, publish by rename, delete without half-states.

POSIX makes a rename atomic but not durable: after a power cut the new name survives only if
the file data *and* the directory holding the name were fsynced. So a checkpoint is published
as: fsync every file, fsync its directory, rename it, fsync the parent. The same discipline
serves the tier-2 copy. These helpers hold no policy; the writer decides what to call when.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
import uuid
from pathlib import Path

from replicaft.checkpoint.entries import scan
from replicaft.checkpoint.layout import is_tmp_dirname, tmp_dirname
from replicaft.checkpoint.leftovers import host_digest, is_abandoned, owner_of, owner_token
from replicaft.checkpoint.manifest import FileEntry

logger = logging.getLogger(__name__)

READ_BYTES = 4 * 1024 * 1024


def new_token() -> str:
    """A fresh suffix for a temporary directory name, unique across writers and crashes, that
    names its owner (this host and process: leftovers.py)."""
    return owner_token(os.getpid(), uuid.uuid4().hex)


def file_entry(path: Path) -> FileEntry:
    """``path``'s manifest entry: its size and SHA-256. It does not fsync: a checkpoint's files
    are durable already, fsynced by whoever wrote them (storage.py's packs and index,
    :func:`write_durably`), and a second fsync of each cost a save milliseconds under load."""
    h = hashlib.sha256()
    num_bytes = 0
    with open(path, "rb") as f:
        while chunk := f.read(READ_BYTES):
            h.update(chunk)
            num_bytes += len(chunk)
    return FileEntry(path.name, num_bytes, h.hexdigest())


def write_durably(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp: Path, final: Path) -> None:
    """Make ``tmp`` visible as ``final`` (atomic, then durable). ``final`` must not exist."""
    fsync_dir(tmp)
    os.rename(tmp, final)
    fsync_dir(final.parent)


def discard(path: Path, step: int) -> None:
    """Delete a checkpoint directory so that a crash midway leaves only ignorable garbage.

    The directory is first renamed into the temporary namespace (readers ignore it, the next
    writer removes it), then removed. Raises OSError if the rename fails.
    """
    doomed = path.with_name(tmp_dirname(path.name, f"deleting-{new_token()}"))
    os.rename(path, doomed)
    fsync_dir(path.parent)
    shutil.rmtree(doomed, ignore_errors=True)


def remove_partial(path: Path) -> None:
    """Remove a temporary directory after a failed save; never raises (the save already failed)."""
    shutil.rmtree(path, ignore_errors=True)
    if path.exists():
        logger.error("could not remove the partial checkpoint %s; the next writer will retry", path)


def remove_leftovers(directory: Path, *, now: float | None = None) -> list[str]:
    """Remove the temporary directories in ``directory`` that are provably abandoned (their
    owner died, or they are older than leftovers.ABANDONED_AFTER_S); another writer's save in
    flight is left alone. The writer calls it once, before its first save. Returns the names removed."""
    removed = []
    now = time.time() if now is None else now
    this_host = host_digest()
    for entry in scan(directory):
        if not (entry.is_dir and is_tmp_dirname(entry.path.name)):  # a link named like one is left alone
            continue
        token = entry.path.name.split(".tmp-", 1)[1]
        try:
            age_s = now - os.lstat(entry.path).st_mtime
        except FileNotFoundError:
            continue  # its owner published or removed it meanwhile
        owner = owner_of(token)
        alive = _pid_alive(owner[1]) if owner is not None and owner[0] == this_host else None
        if is_abandoned(token, age_s, this_host=this_host, pid_alive=alive):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path.name)
        else:
            logger.info("left %s alone: another writer's save or delete may be in flight", entry.path)
    return removed


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
