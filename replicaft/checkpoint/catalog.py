"""The catalog: every published checkpoint of a directory, with its tags, in one queryable file.

``DIR/catalog.sqlite`` (stdlib sqlite3) holds one row per checkpoint in ``DIR``: name,
lineage (the run's history id), step, epoch, experiment, config hash, code version, metrics,
tags, roles (why retention keeps it: latest, milestone, epoch_end, geometric, best, chain,
pending_upload; and emergency for a preemption save), tiers (local, tier2, object), size,
format version and save kind (base/increment). ``replicaft-ckpt catalog`` / ``find`` /
``show`` / ``tag`` read and write it.

**The catalog is a cache; the manifests are the record.** Every field but the roles, the
object tier and tags added by ``replicaft-ckpt tag`` comes from a checkpoint's
``manifest.json`` (labels.py); those added tags are also appended to ``DIR/catalog-tags.jsonl``
(one fsynced JSON line each), so :meth:`Catalog.rebuild` restores everything except the roles
(the writer sets them again at its next publish) and the object tier. A catalog that is
missing or cannot be read is rebuilt, with a warning: nothing in training or a resume reads
it, and a failure to write it is logged and reported beside a published save, never as its
failure. A catalog that is locked past ``BUSY_TIMEOUT_S`` or is not a regular file (a
directory, a link out of the checkpoint directory) is a clear error (catalog_files.py), never
rebuilt over: it may be another process's, or not this code's to delete. The row itself is
catalog_entry.py, and the tables that hold it (the schema, an entry as rows, ``find``'s query)
catalog_tables.py.

**Crashes.** WAL journal mode, one transaction per change (a checkpoint's row, tags and
metrics together): a process killed mid-write loses at most the change it was making, and
readers never see half of one. ``synchronous=NORMAL``: a power loss may also lose the last
few changes, which a rebuild restores. Each call opens its own short-lived connection, so
the writer thread, the training thread and a shell can use one catalog at once (sqlite's
locks, ``BUSY_TIMEOUT_S``). Importing this module does not import torch (the manifests are
read through reader.py, imported when a rebuild needs it). Rejected: a JSON index file
rewritten per publish (a torn write loses every row; two writers race) and querying the
manifests on every ``find`` (reads every checkpoint directory, slow on a network filesystem
with thousands of them).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Literal

from replicaft.checkpoint.catalog_entry import CatalogEntry, Tier, entry_of, tag_text
from replicaft.checkpoint.catalog_files import (
    CATALOG_FILE,
    USER_TAGS_FILE,
    CatalogError,
    CatalogLocked,
    check_regular,
    discard_catalog,
    user_tags,
)
from replicaft.checkpoint.catalog_tables import (
    SCHEMA_VERSION,
    create_tables,
    find_query,
    insert_entry,
    join_set,
    read_entry,
    schema_version,
    set_tags,
    split_set,
)
from replicaft.checkpoint.labels import EPOCH_TAG, check_tag
from replicaft.errors import CheckpointCorrupt

logger = logging.getLogger(__name__)

BUSY_TIMEOUT_S = 10.0
"""How long a change waits for another process's transaction (a rebuild of thousands of rows
takes well under a second): the bound on a locked catalog's wait."""


class Catalog:
    """The catalog of checkpoint directory ``directory``. Build anywhere (no I/O); any thread."""

    def __init__(self, directory: str | Path, *, tier2_directory: str | Path | None = None) -> None:
        self.directory = Path(directory)
        self.tier2_directory = Path(tier2_directory) if tier2_directory is not None else None
        """Consulted by :meth:`rebuild` for the tiers a checkpoint lives in."""
        self.path = self.directory / CATALOG_FILE

    # -- health ------------------------------------------------------------------------------

    def ensure(self) -> str | None:
        """Make the catalog usable: None when it was, else what was wrong (missing while
        checkpoints exist, unreadable, another schema), after rebuilding it. Raises
        CatalogError when even a rebuild fails (an unwritable directory) or the catalog is not
        a regular file (a directory, a link: not deleted), CatalogLocked when another process
        holds it past ``BUSY_TIMEOUT_S`` (a live catalog is never rebuilt under its user)."""
        from replicaft.checkpoint.reader import scan_checkpoints

        if not self.directory.is_dir():
            return None
        if not self.path.exists():
            if not scan_checkpoints(self.directory).found:
                return None
            problem = f"{self.path} is missing"
        else:
            try:
                with self._connect() as db:
                    version = schema_version(db)
                    check = db.execute("PRAGMA quick_check").fetchone()
                problem = None
                if version != str(SCHEMA_VERSION):
                    problem = f"{self.path} has schema {version or 'none'}, expected {SCHEMA_VERSION}"
                elif check[0] != "ok":
                    problem = f"{self.path} failed its integrity check: {check[0]}"
            except sqlite3.DatabaseError as e:
                if _is_locked(e):
                    raise self._locked(e) from e
                problem = f"{self.path} cannot be read ({e})"
            if problem is None:
                return None
        count = self.rebuild()
        return f"{problem}; rebuilt it from the manifests of {count} checkpoint(s)"

    def rebuild(self) -> int:
        """Replace the catalog with one read from the checkpoints' manifests and the tags file;
        the number of checkpoints. Damaged checkpoints (no readable manifest) are left out."""
        from replicaft.checkpoint.reader import read_manifest, scan_checkpoints

        entries = []
        tier2 = {p.name for _, p in scan_checkpoints(self.tier2_directory).found} if self.tier2_directory else set()
        for _, path in scan_checkpoints(self.directory).found:
            try:
                manifest = read_manifest(path)
            except CheckpointCorrupt as e:
                logger.warning("catalog rebuild leaves out %s: %s", path, e)
                continue
            entries.append(
                entry_of(path.name, manifest, tiers=("local", "tier2") if path.name in tier2 else ("local",))
            )
        tags = list(user_tags(self.directory))
        discard_catalog(self.path)
        try:
            with self._transaction() as db:
                for entry in entries:
                    insert_entry(db, entry)
                for name, tagged in tags:
                    set_tags(db, name, tagged)
        except sqlite3.Error as e:
            raise self._locked(e) if _is_locked(e) else CatalogError(f"cannot rebuild {self.path}: {e}") from e
        return len(entries)

    # -- the writer's changes (each one transaction; never raises) ---------------------------

    def record(
        self, entry: CatalogEntry, *, roles: Mapping[str, Iterable[str]] | None = None, removed: Iterable[str] = ()
    ) -> str | None:
        """Add or replace the row of a just-published checkpoint, with retention's verdicts of
        the same save: the roles of the checkpoints it keeps (an emergency save stays one) and
        the rows of those it deleted dropped. One transaction a save: each costs a connection
        and a commit, a few milliseconds of every save. Returns what failed (logged), else None."""

        def change(db: sqlite3.Connection) -> None:
            insert_entry(db, entry)
            for name, new in (roles or {}).items():
                row = db.execute("SELECT roles FROM checkpoints WHERE name = ?", (name,)).fetchone()
                if row is not None:
                    kept = {"emergency"} & set(split_set(row[0]))
                    db.execute("UPDATE checkpoints SET roles = ? WHERE name = ?", (join_set(set(new) | kept), name))
            for name in removed:
                for table in ("checkpoints", "tags", "metrics"):
                    db.execute(f"DELETE FROM {table} WHERE name = ?", (name,))

        return self._safely("record " + entry.name, change)

    def set_tier(self, names: Iterable[str], tier: Tier, present: bool) -> str | None:
        """Note that the named checkpoints are (``present``) or are no longer in ``tier``;
        what failed (logged), else None."""

        def change(db: sqlite3.Connection) -> None:
            for name in names:
                row = db.execute("SELECT tiers FROM checkpoints WHERE name = ?", (name,)).fetchone()
                if row is not None:
                    tiers = set(split_set(row[0])) | {tier} if present else set(split_set(row[0])) - {tier}
                    db.execute("UPDATE checkpoints SET tiers = ? WHERE name = ?", (join_set(tiers), name))

        return self._safely(f"update tier {tier}", change)

    # -- an operator's changes and queries (raise CatalogError) ------------------------------

    def tag(self, name: str, tags: Mapping[str, str]) -> None:
        """Add tags to checkpoint ``name``: appended to the tags file first (the record a
        rebuild replays), then to the catalog. Raises ValueError for a bad tag or an unknown
        checkpoint, CatalogError when the catalog cannot be written."""
        from replicaft.checkpoint.durable import fsync_dir

        checked = {
            key: tag_text(check_tag(key, int(value) if key == EPOCH_TAG and value.isdigit() else value))
            for key, value in tags.items()
        }
        if self.get(name) is None:
            raise ValueError(
                f"{name} is not in the catalog of {self.directory}; see `replicaft-ckpt catalog "
                f"{self.directory}` (or --rebuild it if the checkpoint exists)"
            )
        line = json.dumps({"name": name, "tags": checked}, sort_keys=True) + "\n"
        tags_file = self.directory / USER_TAGS_FILE
        check_regular(tags_file, suffixes=("",))
        with open(tags_file, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(self.directory)
        try:
            with self._transaction() as db:
                set_tags(db, name, checked)
        except sqlite3.Error as e:
            raise (
                self._locked(e) if _is_locked(e) else CatalogError(f"cannot write the catalog {self.path}: {e}")
            ) from e

    def get(self, name: str) -> CatalogEntry | None:
        rows = self.find(name=name)
        return rows[0] if rows else None

    def find(
        self,
        *,
        name: str | None = None,
        experiment: str | None = None,
        lineage: str | None = None,
        tags: Mapping[str, str] | None = None,
        min_step: int | None = None,
        max_step: int | None = None,
        best: str | None = None,
        mode: Literal["min", "max"] = "min",
        limit: int | None = None,
    ) -> list[CatalogEntry]:
        """Rows matching every filter given, newest first; with ``best``, only rows that have
        that metric, best first (ties: the newer first, as keep-best retention breaks them)."""
        sql, args = find_query(
            name=name,
            experiment=experiment,
            lineage=lineage,
            tags=tags,
            min_step=min_step,
            max_step=max_step,
            best=best,
            mode=mode,
            limit=limit,
        )
        try:
            with self._connect() as db:
                return [read_entry(db, row) for row in db.execute(sql, args).fetchall()]
        except sqlite3.Error as e:
            if _is_locked(e):
                raise self._locked(e) from e
            raise CatalogError(
                f"cannot read the catalog {self.path}: {e}; rebuild it with "
                f"`replicaft-ckpt catalog --rebuild {self.directory}`"
            ) from e

    # -- plumbing ----------------------------------------------------------------------------

    def _safely(self, what: str, change: Callable[[sqlite3.Connection], None]) -> str | None:
        """Run ``change(db)`` in one transaction; on an unreadable catalog, rebuild it once and
        retry. Any failure is logged and returned (the catalog is a cache: never stop a save for it)."""
        for attempt in (1, 2):
            try:
                with self._transaction() as db:
                    change(db)
                return None
            except sqlite3.DatabaseError as e:
                if attempt == 2 or _is_locked(e):
                    return self._gave_up(what, e)
                logger.warning("catalog %s cannot be read (%s); rebuilding it from the manifests", self.path, e)
                try:
                    self.rebuild()
                except (CatalogError, sqlite3.Error, OSError) as rebuild_error:
                    return self._gave_up(what, rebuild_error)
            except (CatalogError, sqlite3.Error, OSError) as e:
                return self._gave_up(what, e)
        return None

    def _gave_up(self, what: str, error: BaseException) -> str:
        problem = f"catalog {self.path}: could not {what}: {error}"
        logger.warning(
            "%s; the checkpoints are unaffected (rebuild it with `replicaft-ckpt catalog --rebuild %s`)",
            problem,
            self.directory,
        )
        return problem

    def _locked(self, error: sqlite3.Error) -> CatalogLocked:
        return CatalogLocked(
            f"the catalog {self.path} is locked: another process held it for more than {BUSY_TIMEOUT_S:g}s "
            f"({error}); try again once that process (a writer, another replicaft-ckpt) is done"
        )

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        check_regular(self.path)
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            yield db
        finally:
            db.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction on a catalog with the current schema (created if absent)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                create_tables(db)
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")


def _is_locked(error: BaseException) -> bool:
    return isinstance(error, sqlite3.OperationalError) and ("locked" in str(error) or "busy" in str(error))
