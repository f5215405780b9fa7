"""The catalog's weak answers (issue 37): each a clear error or a logged, bounded fallback.

Each test failed on the code before the fix: a locked catalog was deleted and rebuilt under
its user (or a traceback), a tags line nested 100 000 deep raised RecursionError out of a
rebuild (and so failed a published save), a directory named ``catalog.sqlite`` gave a
traceback, and a link named ``catalog.sqlite`` was followed out of the checkpoint directory.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import torch

from replicaft.checkpoint import CheckpointWriter, SaveResult
from replicaft.checkpoint import catalog as catalog_module
from replicaft.checkpoint.__main__ import main
from replicaft.checkpoint.catalog import CATALOG_FILE, USER_TAGS_FILE, Catalog
from replicaft.checkpoint.telemetry import CheckpointTelemetry
from replicaft.persistence.save_events import report_save
from replicaft.state.flat import flatten
from replicaft.transfer.snapshot import Snapshot

LINEAGE = "0123456789ab"


def save(directory: Path, step: int) -> SaveResult:
    snap = Snapshot.capture(flatten({"model": {"w": torch.ones(16)}}), step=step, quorum_id=1, replica_id="g0")
    with CheckpointWriter(directory, lineage=LINEAGE, keep_last=5) as writer:
        return writer.save_async(snap, step).wait(60)


def test_locked_catalog_is_a_clear_error_within_the_bound_and_is_not_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert save(tmp_path, 10).ok
    monkeypatch.setattr(catalog_module, "BUSY_TIMEOUT_S", 0.2)
    holder = sqlite3.connect(tmp_path / CATALOG_FILE, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        assert main(["catalog", str(tmp_path)]) == 0  # WAL: a reader is not held up by a writer
        assert main(["tag", str(tmp_path / f"step-000000010-{LINEAGE}"), "keep=yes"]) == 1
        err = capsys.readouterr().err
        assert f"the catalog {tmp_path / CATALOG_FILE} is locked: another process held it for more than 0.2s" in err
        assert "Traceback" not in err
        holder.execute("ROLLBACK")
    finally:
        holder.close()
    assert [e.step for e in Catalog(tmp_path).find()] == [10], "the locked catalog was kept, not replaced"
    assert main(["tag", str(tmp_path / f"step-000000010-{LINEAGE}"), "keep=yes"]) == 0  # once it is free


def test_deep_tags_line_is_skipped_and_the_save_is_published(tmp_path: Path) -> None:
    assert save(tmp_path, 10).ok
    assert main(["tag", str(tmp_path / f"step-000000010-{LINEAGE}"), "keep=yes"]) == 0
    with open(tmp_path / USER_TAGS_FILE, "a") as f:
        f.write("[" * 100_000 + "]" * 100_000 + "\n")
    (tmp_path / CATALOG_FILE).write_bytes(b"not a database" * 100)  # the next change rebuilds it
    result = save(tmp_path, 20)
    assert result.ok and result.catalog_error is None, result
    rows = {e.step: e for e in Catalog(tmp_path).find()}
    assert sorted(rows) == [10, 20] and rows[10].tags["keep"] == "yes"


@pytest.mark.parametrize("kind", ["dir", "symlink"])
def test_catalog_that_is_not_a_regular_file_is_refused_the_save_published_and_reported(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    directory, outside = tmp_path / "ckpt", tmp_path / "outside.sqlite"
    directory.mkdir()
    if kind == "dir":
        (directory / CATALOG_FILE).mkdir()
    else:
        (directory / CATALOG_FILE).symlink_to(outside)
    result = save(directory, 10)
    message = f"{directory / CATALOG_FILE} is a {kind}, not a regular file; the catalog is not followed or opened"
    assert result.ok and result.status == "published", result
    assert result.catalog_error is not None and message in result.catalog_error
    assert not outside.exists(), "the catalog was written out of the checkpoint directory"
    assert (directory / CATALOG_FILE).is_symlink() if kind == "symlink" else (directory / CATALOG_FILE).is_dir()

    events: list[tuple[str, dict[str, object]]] = []
    report_save(
        result,
        None,
        CheckpointTelemetry(str(directory), has_object_tier=False),
        lambda event, **fields: events.append((event, fields)),
        "g0",
    )
    failed = [fields for event, fields in events if event == "catalog_update_failed"]
    assert failed == [{"checkpoint_step": 10, "error": result.catalog_error}]
    assert [fields["ok"] for event, fields in events if event == "checkpoint"] == [True]

    assert main(["catalog", str(directory)]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
