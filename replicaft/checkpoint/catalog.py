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
missing or cannot be read is rebuilt, with a warning, never an error: nothing in training or
a resume reads it, and a failure to write it is logged and otherwise ignored.

**Crashes.** WAL journal mode, one transaction per change (a checkpoint's row, tags and
metrics together): a process killed mid-write loses at most the change it was making, and
readers never see half of one. ``synchronous=NORMAL``: a power loss may also lose the last
few changes, which a rebuild restores. Each call opens its own short-lived connection, so
the writer thread, the training thread and a shell can use one catalog at once (sqlite's
locks, ``BUSY_TIMEOUT_S``). Importing this module does not import torch (the manifests are
read through reader.py, imported when a rebuild needs it). Rejected: a JSON index file rewritten per publish (a torn
write
loses every row; two writers race) and querying the manifests on every ``find`` (reads every
checkpoint directory, slow on a network filesystem with thousands of them).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import json
import logging
import os
import sqlite3
import subprocess
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from replicaft.checkpoint.labels import EPOCH_TAG, EXPERIMENT_TAG, TagValue, check_tag, labels_of
from replicaft.errors import CheckpointCorrupt

if TYPE_CHECKING:
    from replicaft.checkpoint.manifest import CheckpointManifest

logger = logging.getLogger(__name__)

CATALOG_FILE = "catalog.sqlite"
USER_TAGS_FILE = "catalog-tags.jsonl"
SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 10.0
"""How long a change waits for another process's transaction (a rebuild of thousands of rows
takes well under a second)."""
GIT_TIMEOUT_S = 5.0
Tier = Literal["local", "tier2", "object"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints(
    name TEXT PRIMARY KEY, lineage TEXT NOT NULL, step INTEGER NOT NULL, epoch INTEGER, experiment TEXT,
    config_hash TEXT, code_version TEXT, roles TEXT NOT NULL, tiers TEXT NOT NULL, num_bytes INTEGER NOT NULL,
    format_version INTEGER NOT NULL, save_kind TEXT NOT NULL, created_unix_s REAL NOT NULL);
CREATE TABLE IF NOT EXISTS tags(name TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY(name, key));
CREATE TABLE IF NOT EXISTS metrics(name TEXT NOT NULL, key TEXT NOT NULL, value REAL NOT NULL, PRIMARY KEY(name, key));
"""
_COLUMNS = (
    "name",
    "lineage",
    "step",
    "epoch",
    "experiment",
    "config_hash",
    "code_version",
    "roles",
    "tiers",
    "num_bytes",
    "format_version",
    "save_kind",
    "created_unix_s",
)


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    name: str
    lineage: str
    step: int
    epoch: int | None
    experiment: str | None
    config_hash: str | None
    code_version: str | None
    roles: tuple[str, ...]
    tiers: tuple[str, ...]
    num_bytes: int
    """This checkpoint's own files (an increment's chain is not counted)."""
    format_version: int
    save_kind: str
    """"base" or "increment" (chain.py)."""
    created_unix_s: float
    tags: dict[str, str] = field(default_factory=dict)
    """Tag values as text (str as is, others as JSON: 3, true, 0.5)."""
    metrics: dict[str, float] = field(default_factory=dict)


def tag_text(value: TagValue) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def entry_of(
    name: str, manifest: CheckpointManifest, *, tiers: Iterable[Tier] = ("local",), roles: Iterable[str] = ()
) -> CatalogEntry:
    """The catalog row of checkpoint ``name`` (a directory name), from its manifest. Pure."""
    labels = labels_of(manifest.metadata)
    all_roles = set(roles) | ({"emergency"} if manifest.metadata.get("reason") == "preemption" else set())
    return CatalogEntry(
        name,
        manifest.lineage,
        manifest.step,
        labels.epoch,
        labels.experiment,
        labels.config_hash,
        labels.code_version,
        tuple(sorted(all_roles)),
        tuple(sorted(set(tiers))),
        manifest.num_bytes,
        manifest.version,
        manifest.kind,
        manifest.created_unix_s,
        {k: tag_text(v) for k, v in labels.tags.items()},
        dict(labels.metrics),
    )


@functools.cache
def code_version() -> str:
    """``git describe --always --dirty --tags`` of the working directory, else the installed
    replicaft's version: what a checkpoint's code was. Computed once per process."""
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--tags"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    version = installed_version()
    return f"replicaft {version}" if version != "unknown" else version


@functools.cache
def installed_version() -> str:
    """The installed replicaft's version, or "unknown"; looked up once (a few ms a save)."""
    try:
        return importlib.metadata.version("replicaft")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class CatalogError(Exception):
    """The catalog cannot be read or written (internal to this module and its callers)."""


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
        CatalogError only when even a rebuild fails (an unwritable directory)."""
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
                    version = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                    check = db.execute("PRAGMA quick_check").fetchone()
                problem = None
                if version is None or version[0] != str(SCHEMA_VERSION):
                    problem = f"{self.path} has schema {version[0] if version else 'none'}, expected {SCHEMA_VERSION}"
                elif check[0] != "ok":
                    problem = f"{self.path} failed its integrity check: {check[0]}"
            except sqlite3.DatabaseError as e:
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
        self._discard_file()
        with self._transaction() as db:
            for entry in entries:
                _insert(db, entry)
            for name, tags in self._user_tags():
                _set_tags(db, name, tags)
        return len(entries)

    # -- the writer's changes (each one transaction; never raises) ---------------------------

    def record(
        self, entry: CatalogEntry, *, roles: Mapping[str, Iterable[str]] | None = None, removed: Iterable[str] = ()
    ) -> None:
        """Add or replace the row of a just-published checkpoint, with retention's verdicts of
        the same save: the roles of the checkpoints it keeps (an emergency save stays one) and
        the rows of those it deleted dropped. One transaction a save: each costs a connection
        and a commit, a few milliseconds of every save."""

        def change(db: sqlite3.Connection) -> None:
            _insert(db, entry)
            for name, new in (roles or {}).items():
                row = db.execute("SELECT roles FROM checkpoints WHERE name = ?", (name,)).fetchone()
                if row is not None:
                    kept = {"emergency"} & set(_split(row[0]))
                    db.execute("UPDATE checkpoints SET roles = ? WHERE name = ?", (_join(set(new) | kept), name))
            for name in removed:
                for table in ("checkpoints", "tags", "metrics"):
                    db.execute(f"DELETE FROM {table} WHERE name = ?", (name,))

        self._safely("record " + entry.name, change)

    def set_tier(self, names: Iterable[str], tier: Tier, present: bool) -> None:
        """Note that the named checkpoints are (``present``) or are no longer in ``tier``."""

        def change(db: sqlite3.Connection) -> None:
            for name in names:
                row = db.execute("SELECT tiers FROM checkpoints WHERE name = ?", (name,)).fetchone()
                if row is not None:
                    tiers = set(_split(row[0])) | {tier} if present else set(_split(row[0])) - {tier}
                    db.execute("UPDATE checkpoints SET tiers = ? WHERE name = ?", (_join(tiers), name))

        self._safely(f"update tier {tier}", change)

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
        with open(tags_file, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(self.directory)
        with self._transaction() as db:
            _set_tags(db, name, checked)

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
        where, args = [], []
        for column, value in (("c.name", name), ("c.experiment", experiment), ("c.lineage", lineage)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if min_step is not None:
            where.append("c.step >= ?")
            args.append(min_step)
        if max_step is not None:
            where.append("c.step <= ?")
            args.append(max_step)
        for key, value in (tags or {}).items():
            where.append("EXISTS (SELECT 1 FROM tags t WHERE t.name = c.name AND t.key = ? AND t.value = ?)")
            args += [key, value]
        join, order = "", "c.step DESC, c.name"
        if best is not None:
            join = "JOIN metrics m ON m.name = c.name AND m.key = ?"
            args.insert(0, best)
            order = f"m.value {'ASC' if mode == 'min' else 'DESC'}, c.step DESC"
        sql = (
            f"SELECT {', '.join('c.' + c for c in _COLUMNS)} FROM checkpoints c {join} "
            f"{'WHERE ' + ' AND '.join(where) if where else ''} ORDER BY {order}"
            f"{f' LIMIT {int(limit)}' if limit is not None else ''}"
        )
        try:
            with self._connect() as db:
                return [self._entry(db, row) for row in db.execute(sql, args).fetchall()]
        except sqlite3.Error as e:
            raise CatalogError(
                f"cannot read the catalog {self.path}: {e}; rebuild it with "
                f"`replicaft-ckpt catalog --rebuild {self.directory}`"
            ) from e

    # -- plumbing ----------------------------------------------------------------------------

    def _entry(self, db: sqlite3.Connection, row: tuple) -> CatalogEntry:
        values = dict(zip(_COLUMNS, row, strict=True))
        tags = dict(db.execute("SELECT key, value FROM tags WHERE name = ? ORDER BY key", (values["name"],)).fetchall())
        metrics = dict(db.execute("SELECT key, value FROM metrics WHERE name = ? ORDER BY key", (values["name"],)))
        values["roles"], values["tiers"] = _split(values["roles"]), _split(values["tiers"])
        return CatalogEntry(**values, tags=tags, metrics=metrics)

    def _user_tags(self) -> Iterator[tuple[str, dict[str, str]]]:
        """The tags file's records, oldest first; a torn last line (a crash mid-append) is skipped."""
        try:
            lines = (self.directory / USER_TAGS_FILE).read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
                name, tags = record["name"], {str(k): str(v) for k, v in record["tags"].items()}
            except (ValueError, KeyError, TypeError, AttributeError):
                logger.warning("%s line %d is not a tag record; skipped", self.directory / USER_TAGS_FILE, number)
                continue
            yield name, tags

    def _safely(self, what: str, change: Callable[[sqlite3.Connection], None]) -> None:
        """Run ``change(db)`` in one transaction; on an unreadable catalog, rebuild it once and
        retry; any other failure is logged (the catalog is a cache: never stop a save for it)."""
        for attempt in (1, 2):
            try:
                with self._transaction() as db:
                    change(db)
                return
            except sqlite3.DatabaseError as e:
                if attempt == 2 or isinstance(e, sqlite3.OperationalError) and "locked" in str(e):
                    logger.warning(
                        "catalog %s: could not %s: %s; the checkpoints are unaffected (rebuild it with "
                        "`replicaft-ckpt catalog --rebuild %s`)",
                        self.path,
                        what,
                        e,
                        self.directory,
                    )
                    return
                logger.warning("catalog %s cannot be read (%s); rebuilding it from the manifests", self.path, e)
                try:
                    self.rebuild()
                except (CatalogError, sqlite3.Error, OSError) as rebuild_error:
                    logger.warning("catalog %s: rebuild failed: %s", self.path, rebuild_error)
                    return
            except (CatalogError, sqlite3.Error, OSError) as e:
                logger.warning("catalog %s: could not %s: %s; the checkpoints are unaffected", self.path, what, e)
                return

    def _discard_file(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.path}{suffix}")

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
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
                # One statement at a time: executescript would commit the transaction first.
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    db.execute(statement)
                db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")


def _insert(db: sqlite3.Connection, entry: CatalogEntry) -> None:
    values = [getattr(entry, c) for c in _COLUMNS]
    values[_COLUMNS.index("roles")], values[_COLUMNS.index("tiers")] = _join(entry.roles), _join(entry.tiers)
    db.execute(f"INSERT OR REPLACE INTO checkpoints VALUES ({', '.join('?' * len(_COLUMNS))})", values)
    db.execute("DELETE FROM tags WHERE name = ?", (entry.name,))
    db.execute("DELETE FROM metrics WHERE name = ?", (entry.name,))
    _set_tags(db, entry.name, entry.tags)
    db.executemany("INSERT INTO metrics VALUES (?, ?, ?)", [(entry.name, k, v) for k, v in entry.metrics.items()])


def _set_tags(db: sqlite3.Connection, name: str, tags: Mapping[str, str]) -> None:
    """Set tags of ``name``; ``experiment`` and ``epoch`` also fill their columns."""
    db.executemany("INSERT OR REPLACE INTO tags VALUES (?, ?, ?)", [(name, k, v) for k, v in tags.items()])
    if EXPERIMENT_TAG in tags:
        db.execute("UPDATE checkpoints SET experiment = ? WHERE name = ?", (tags[EXPERIMENT_TAG], name))
    if tags.get(EPOCH_TAG, "").isdigit():
        db.execute("UPDATE checkpoints SET epoch = ? WHERE name = ?", (int(tags[EPOCH_TAG]), name))


def _split(text: str) -> tuple[str, ...]:
    return tuple(t for t in text.split(",") if t)


def _join(values: Iterable[str]) -> str:
    return ",".join(sorted(set(values)))
