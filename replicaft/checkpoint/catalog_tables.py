"""The catalog's tables: the sqlite schema, a :class:`CatalogEntry` as rows and back, and ``find``'s query.

One checkpoint is a row of ``checkpoints`` (its scalar fields, its roles and tiers as sorted
comma-joined text) plus a row per tag in ``tags`` and per metric in ``metrics``, all keyed by
the checkpoint's name; ``experiment`` and ``epoch`` are tags that also fill their columns, so
``find(experiment=...)`` is a column match, and a query by tag or by best metric a join on
their tables' ``(name, key)`` primary keys.

Functions on an open connection, inside the caller's transaction (catalog.py owns the
connections, their locks and the recovery from a damaged file); :func:`find_query` touches no
database at all.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from replicaft.checkpoint.catalog_entry import CatalogEntry
from replicaft.checkpoint.labels import EPOCH_TAG, EXPERIMENT_TAG

SCHEMA_VERSION = 1

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


def create_tables(db: sqlite3.Connection) -> None:
    """Create the tables a catalog lacks and stamp :data:`SCHEMA_VERSION`, inside the open transaction."""
    # One statement at a time: executescript would commit the transaction first.
    for statement in filter(str.strip, _SCHEMA.split(";")):
        db.execute(statement)
    db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))


def schema_version(db: sqlite3.Connection) -> str | None:
    """The schema version a catalog was written with; None: not stamped (not a catalog of ours)."""
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return None if row is None else row[0]


def insert_entry(db: sqlite3.Connection, entry: CatalogEntry) -> None:
    """Write ``entry`` as its rows, replacing any it had (its tags and metrics too)."""
    values = [getattr(entry, c) for c in _COLUMNS]
    values[_COLUMNS.index("roles")], values[_COLUMNS.index("tiers")] = join_set(entry.roles), join_set(entry.tiers)
    db.execute(f"INSERT OR REPLACE INTO checkpoints VALUES ({', '.join('?' * len(_COLUMNS))})", values)
    db.execute("DELETE FROM tags WHERE name = ?", (entry.name,))
    db.execute("DELETE FROM metrics WHERE name = ?", (entry.name,))
    set_tags(db, entry.name, entry.tags)
    db.executemany("INSERT INTO metrics VALUES (?, ?, ?)", [(entry.name, k, v) for k, v in entry.metrics.items()])


def set_tags(db: sqlite3.Connection, name: str, tags: Mapping[str, str]) -> None:
    """Set tags of ``name``; ``experiment`` and ``epoch`` also fill their columns."""
    db.executemany("INSERT OR REPLACE INTO tags VALUES (?, ?, ?)", [(name, k, v) for k, v in tags.items()])
    if EXPERIMENT_TAG in tags:
        db.execute("UPDATE checkpoints SET experiment = ? WHERE name = ?", (tags[EXPERIMENT_TAG], name))
    if tags.get(EPOCH_TAG, "").isdigit():
        db.execute("UPDATE checkpoints SET epoch = ? WHERE name = ?", (int(tags[EPOCH_TAG]), name))


def read_entry(db: sqlite3.Connection, row: tuple) -> CatalogEntry:
    """The entry of a ``checkpoints`` row selected as :func:`find_query` selects it, with its tags and metrics."""
    values = dict(zip(_COLUMNS, row, strict=True))
    tags = dict(db.execute("SELECT key, value FROM tags WHERE name = ? ORDER BY key", (values["name"],)).fetchall())
    metrics = dict(db.execute("SELECT key, value FROM metrics WHERE name = ? ORDER BY key", (values["name"],)))
    values["roles"], values["tiers"] = split_set(values["roles"]), split_set(values["tiers"])
    return CatalogEntry(**values, tags=tags, metrics=metrics)


def find_query(
    *,
    name: str | None,
    experiment: str | None,
    lineage: str | None,
    tags: Mapping[str, str] | None,
    min_step: int | None,
    max_step: int | None,
    best: str | None,
    mode: Literal["min", "max"],
    limit: int | None,
) -> tuple[str, list[Any]]:
    """The SQL and arguments of ``Catalog.find`` (its docstring says what each filter means)."""
    where: list[str] = []
    args: list[Any] = []
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
    return sql, args


def split_set(text: str) -> tuple[str, ...]:
    """The roles or tiers of a ``checkpoints`` column."""
    return tuple(t for t in text.split(",") if t)


def join_set(values: Iterable[str]) -> str:
    """Roles or tiers as their column holds them: sorted, once each, comma-joined."""
    return ",".join(sorted(set(values)))
