"""The catalog's tables (replicaft/checkpoint/catalog_tables.py) on an in-memory sqlite: an
entry written as rows reads back equal, and ``find_query``'s filters and orders select what
``Catalog.find`` promises."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from replicaft.checkpoint.catalog_entry import CatalogEntry
from replicaft.checkpoint.catalog_tables import (
    SCHEMA_VERSION,
    create_tables,
    find_query,
    insert_entry,
    read_entry,
    schema_version,
    set_tags,
)

NO_FILTER: dict[str, Any] = dict(
    name=None, experiment=None, lineage=None, tags=None, min_step=None, max_step=None, best=None, mode="min", limit=None
)


def entry(step: int, **fields: Any) -> CatalogEntry:
    values: dict[str, Any] = dict(
        name=f"step-{step:06d}",
        lineage="0123456789ab",
        step=step,
        epoch=None,
        experiment=None,
        config_hash=None,
        code_version="v1",
        roles=("milestone", "latest"),
        tiers=("local",),
        num_bytes=100 * step,
        format_version=3,
        save_kind="base",
        created_unix_s=1_700_000_000.0 + step,
        tags={"run": "a"},
        metrics={"loss": 1.0 / step},
    )
    return CatalogEntry(**{**values, **fields})


@pytest.fixture
def db() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:", isolation_level=None)
    create_tables(db)
    for step in (1, 2, 3):
        insert_entry(db, entry(step))
    return db


def found(db: sqlite3.Connection, **filters: Any) -> list[int]:
    sql, args = find_query(**{**NO_FILTER, **filters})
    return [read_entry(db, row).step for row in db.execute(sql, args).fetchall()]


def test_an_entry_written_as_rows_reads_back_equal_with_roles_sorted(db: sqlite3.Connection) -> None:
    assert schema_version(db) == str(SCHEMA_VERSION)
    sql, args = find_query(**{**NO_FILTER, "name": "step-000002"})
    (row,) = db.execute(sql, args).fetchall()
    assert read_entry(db, row) == entry(2, roles=("latest", "milestone"))


def test_experiment_and_epoch_tags_fill_their_columns(db: sqlite3.Connection) -> None:
    set_tags(db, "step-000002", {"experiment": "sweep", "epoch": "4"})
    assert found(db, experiment="sweep") == [2]
    assert db.execute("SELECT epoch FROM checkpoints WHERE name = 'step-000002'").fetchone() == (4,)


@pytest.mark.parametrize(
    ("filters", "steps"),
    [
        ({}, [3, 2, 1]),
        ({"min_step": 2}, [3, 2]),
        ({"max_step": 2, "limit": 1}, [2]),
        ({"tags": {"run": "a"}}, [3, 2, 1]),
        ({"tags": {"run": "b"}}, []),
        ({"best": "loss"}, [3, 2, 1]),
        ({"best": "loss", "mode": "max"}, [1, 2, 3]),
        ({"best": "accuracy"}, []),
    ],
    ids=repr,
)
def test_find_query_selects_newest_first_or_best_first(
    db: sqlite3.Connection, filters: dict[str, Any], steps: list[int]
) -> None:
    assert found(db, **filters) == steps
