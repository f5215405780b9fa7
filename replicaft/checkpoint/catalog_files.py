"""The catalog's files, opened without following a link or blocking, and their errors (issue 37).

``DIR/catalog.sqlite`` (with sqlite's ``-wal`` and ``-shm``) and ``DIR/catalog-tags.jsonl``
live in a checkpoint directory that anyone with write access may have filled with anything:
a directory of that name, a link out of the checkpoint directory (sqlite follows it and
would write wherever it points), a FIFO, a tags line nested a million deep. Each is refused
here with what it is and what to do, never a traceback; the catalog is a cache, rebuilt
from the manifests (``replicaft-ckpt catalog --rebuild DIR``), so nothing is lost by moving
such a file away, but it is not this code's to delete.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from replicaft.checkpoint.entries import judge, read_small
from replicaft.errors import CheckpointCorrupt

logger = logging.getLogger(__name__)

CATALOG_FILE = "catalog.sqlite"
USER_TAGS_FILE = "catalog-tags.jsonl"
SQLITE_SUFFIXES = ("", "-wal", "-shm")
MAX_TAGS_FILE_BYTES = 64 * 1024 * 1024
"""A tag record is a line of well under a kilobyte: a million tags fit."""


class CatalogError(Exception):
    """The catalog cannot be read or written (internal to the catalog and its callers)."""


class CatalogLocked(CatalogError):
    """Another process held the catalog longer than the bound (catalog.BUSY_TIMEOUT_S)."""


def check_regular(path: Path, suffixes: tuple[str, ...] = SQLITE_SUFFIXES) -> None:
    """Raise CatalogError unless each of ``path``'s sqlite files (``path`` + each suffix) is
    absent or a regular file: never a link, whose target sqlite would read and write outside
    the checkpoint directory, nor a FIFO, which would block."""
    for suffix in suffixes:
        found = judge(Path(f"{path}{suffix}")).kind
        if found not in ("file", "missing"):
            raise CatalogError(
                f"{path}{suffix} is a {found}, not a regular file; the catalog is not followed or opened "
                f"there. Move it away: the catalog is rebuilt from the manifests (`replicaft-ckpt "
                f"catalog --rebuild {path.parent}`)"
            )


def user_tags(directory: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """The tags file's records, oldest first; a line that is not a tag record (a torn last
    line after a crash mid-append, one nested too deep to decode) is skipped with a warning.
    Raises CatalogError when the file is not a regular file or too big to be one."""
    path = directory / USER_TAGS_FILE
    if judge(path).kind == "missing":
        return
    try:
        lines = read_small(path, str(path), MAX_TAGS_FILE_BYTES, rule="the tags file is a regular file").splitlines()
    except CheckpointCorrupt as e:
        raise CatalogError(str(e)) from e
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            name, tags = record["name"], {str(k): str(v) for k, v in record["tags"].items()}
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            logger.warning("%s line %d is not a tag record; skipped", path, number)
            continue
        yield name, tags


def discard_catalog(path: Path) -> None:
    """Remove the catalog's sqlite files (regular files only: :func:`check_regular` first)."""
    check_regular(path)
    for suffix in SQLITE_SUFFIXES:
        try:
            os.unlink(f"{path}{suffix}")
        except FileNotFoundError:
            pass
