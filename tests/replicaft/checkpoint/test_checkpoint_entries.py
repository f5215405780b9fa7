"""Odd entries in a checkpoint directory and two histories in one (issue 19, bug 3).

Each test here failed on the code before the fix: a dangling link or a loop named like a
checkpoint crashed ``replicaft-ckpt list`` and the startup check; a manifest nested 100 000
deep raised RecursionError out of verify/list/resume; a FIFO in place of ``manifest.json``
hung them; a run restarted from step 0 took the old run's ``step-10`` for its own save.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from replicaft.checkpoint import CheckpointReader, CheckpointWriter
from replicaft.checkpoint.__main__ import main
from replicaft.checkpoint.keys import load_key
from replicaft.checkpoint.layout import MANIFEST_FILE, checkpoint_dirname
from replicaft.errors import OptionsError
from replicaft.state.flat import flatten
from replicaft.transfer.snapshot import Snapshot

OLD, NEW = "0000000000aa", "0000000000bb"


def state(step: int) -> dict[str, object]:
    return {"replicaft": {"step": step}, "model": {"w": torch.full((64,), float(step))}}


def write(directory: Path, lineage: str, steps: list[int]) -> list[Path]:
    paths = []
    with CheckpointWriter(directory, lineage=lineage, keep_last=10) as writer:
        for step in steps:
            snap = Snapshot.capture(flatten(state(step)), step=step, quorum_id=1, replica_id="g0")
            result = writer.save_async(snap, step).wait(60)
            assert result.ok, result.reason
            assert result.path is not None
            paths.append(result.path)
    return paths


def finishes(fn: object, timeout_s: float = 10.0) -> object:
    """Run ``fn`` on a thread; fail (rather than hang the suite) if it blocks."""
    box: list[object] = []
    thread = threading.Thread(target=lambda: box.append(fn()), daemon=True)  # type: ignore[operator]
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"blocked for more than {timeout_s}s"
    return box[0]


@pytest.mark.parametrize("name", ["step-000000900", f"step-000000900-{OLD}"])
def test_dangling_link_and_loop_named_like_checkpoints_are_ignored_not_fatal(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, OLD, [10, 20])
    os.symlink(tmp_path / "nowhere", tmp_path / name)
    loop = tmp_path / "step-000000950"
    os.symlink(loop, loop)

    infos = CheckpointReader(tmp_path).list(verify_files=False)
    assert [i.step for i in infos] == [20, 10]
    assert main(["list", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"{name}: named like a checkpoint but a symlink, not a directory; ignored" in out
    assert "step-000000950: named like a checkpoint but a symlink" in out

    loaded = CheckpointReader(tmp_path).load_latest_valid()
    assert loaded is not None and loaded.step == 20 and loaded.lineage == OLD


def test_link_to_a_real_checkpoint_is_not_a_second_copy_of_it(tmp_path: Path) -> None:
    (path,) = write(tmp_path / "real", OLD, [10])
    os.symlink(path, tmp_path / "real" / checkpoint_dirname(30, OLD))
    assert [i.step for i in CheckpointReader(tmp_path / "real").list()] == [10]
    ok, why = CheckpointReader.verify(tmp_path / "real" / checkpoint_dirname(30, OLD))
    assert not ok and "is a symlink, not a checkpoint directory" in why


def test_manifest_nested_100000_deep_is_invalid_and_resume_falls_back(tmp_path: Path) -> None:
    older, newer = write(tmp_path, OLD, [10, 20])
    (newer / MANIFEST_FILE).write_text("[" * 100_000 + "]" * 100_000)

    ok, why = CheckpointReader.verify(newer)
    assert not ok and "nests deeper than a manifest ever does" in why
    assert [i.valid for i in CheckpointReader(tmp_path).list()] == [False, True]
    loaded = CheckpointReader(tmp_path).load_latest_valid()
    assert loaded is not None and loaded.path == older


def test_fifo_in_place_of_a_manifest_or_a_shard_does_not_hang(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    older, newer = write(tmp_path, OLD, [10, 20])
    (newer / MANIFEST_FILE).unlink()
    os.mkfifo(newer / MANIFEST_FILE)
    shard = older / "pack-0.bin"
    shard.unlink()
    os.mkfifo(shard)

    ok, why = finishes(lambda: CheckpointReader.verify(newer))  # type: ignore[misc]
    assert not ok and f"{newer.name}/{MANIFEST_FILE} is a fifo, not a regular file" in why
    assert finishes(lambda: main(["list", str(tmp_path)])) == 0
    assert "is a fifo, not a regular file" in capsys.readouterr().out
    assert finishes(lambda: CheckpointReader(tmp_path).load_latest_valid()) is None


def test_new_history_never_counts_an_old_histories_checkpoint_as_its_save(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = write(tmp_path, OLD, [10, 20, 30])
    new = write(tmp_path, NEW, [10, 20])  # a run restarted from step 0 beside them

    assert set(new).isdisjoint(old) and all(p.is_dir() for p in old + new)
    with caplog.at_level(logging.INFO, logger="replicaft.checkpoint"):
        loaded = CheckpointReader(tmp_path).load_latest_valid()
    assert "already published" not in caplog.text
    assert loaded is not None and (loaded.step, loaded.lineage) == (20, NEW)
    assert loaded.state["model"]["w"].eq(20.0).all()
    assert (
        f"lineage {NEW} (2 checkpoints, steps 10..20) was written most recently, so it is tried first" in caplog.text
        and f"lineage {OLD} (3 checkpoints, steps 10..30)" in caplog.text
    )


def test_damaged_newest_history_falls_back_to_a_whole_older_one(tmp_path: Path) -> None:
    write(tmp_path, OLD, [10, 20, 30])
    for path in write(tmp_path, NEW, [10, 20]):
        manifest = json.loads((path / MANIFEST_FILE).read_text())
        manifest["files"][0]["sha256"] = "0" * 64
        (path / MANIFEST_FILE).write_text(json.dumps(manifest))

    loaded = CheckpointReader(tmp_path).load_latest_valid()
    assert loaded is not None and (loaded.step, loaded.lineage) == (30, OLD) and loaded.newest_in_lineage


def test_retention_keeps_to_its_own_history(tmp_path: Path) -> None:
    old = write(tmp_path, OLD, [10, 20, 30])
    with CheckpointWriter(tmp_path, lineage=NEW, keep_last=1) as writer:
        for step in (40, 50):
            snap = Snapshot.capture(flatten(state(step)), step=step, quorum_id=1, replica_id="g0")
            assert writer.save_async(snap, step).wait(60).ok
    steps = {(i.lineage, i.step) for i in CheckpointReader(tmp_path).list(verify_files=False)}
    assert steps == {(OLD, 10), (OLD, 20), (OLD, 30), (NEW, 50)} and all(p.is_dir() for p in old)


# -- an operator's own small files: the key file and the files an import reads (issue 37) --------


def error_of(fn: Callable[[], object]) -> Exception | None:
    try:
        fn()
    except Exception as e:
        return e
    return None


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    """A FIFO with no writer; afterwards a writer end is opened once, so that a reader the code
    under test left blocked in ``open`` (the bug) is released rather than kept forever."""
    path = tmp_path / "fifo"
    os.mkfifo(path)
    yield path
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # no reader was left blocked


def test_a_fifo_or_a_directory_as_the_key_file_is_refused_at_once_naming_it(tmp_path: Path, fifo: Path) -> None:
    for path, kind in ((fifo, "fifo"), (tmp_path, "dir")):
        error = finishes(lambda path=path: error_of(lambda: load_key(key_file=path)))
        assert isinstance(error, OptionsError), error
        assert f"the checkpoint key file {path} is a {kind}, not a regular file" in str(error)
    link = tmp_path / "mounted-secret"
    (tmp_path / "real").write_text(bytes(range(32)).hex())
    link.symlink_to(tmp_path / "real")  # an orchestrator's mounted secret is a link: followed
    assert load_key(key_file=link) is not None


def test_import_of_a_fifo_is_refused_at_once_naming_it(tmp_path: Path, fifo: Path) -> None:
    # A process of its own: safetensors blocked in open() holding the GIL, which no thread's
    # deadline in this process could have ended.
    try:
        done = subprocess.run(
            [sys.executable, "-m", "replicaft.checkpoint", "import", str(fifo), "--into", str(tmp_path / "warm")],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("replicaft-ckpt import of a FIFO blocked for more than 60 s")
    assert done.returncode == 1, done
    assert f"{fifo} is a fifo, not a regular file" in done.stdout + done.stderr
