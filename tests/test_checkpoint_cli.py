"""``replicaft-ckpt`` / ``python -m replicaft.checkpoint``: list, verify, exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from replicaft.checkpoint import CheckpointWriter
from replicaft.checkpoint.__main__ import main
from replicaft.checkpoint.layout import checkpoint_dirname
from replicaft.state import flatten
from replicaft.transfer.snapshot import Snapshot

LINEAGE = "0123456789ab"


def name(step: int) -> str:
    return checkpoint_dirname(step, LINEAGE)


def write_checkpoints(directory: Path, steps: list[int]) -> None:
    with CheckpointWriter(directory, lineage=LINEAGE) as writer:
        for step in steps:
            state = {"replicaft": {"step": step}, "model": {"w": torch.full((256,), float(step))}}
            snap = Snapshot.capture(flatten(state), step=step, quorum_id=1, replica_id="g0")
            assert writer.save_async(snap, step).wait(60).ok


def corrupt(path: Path) -> None:
    shard = path / "pack-0.bin"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))


def test_list_shows_step_size_age_and_validity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_checkpoints(tmp_path, [100, 200])
    corrupt(tmp_path / name(200))
    (tmp_path / "step-000000300.tmp-abc123").mkdir()

    assert main(["list", str(tmp_path)]) == 0

    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["200", LINEAGE, "1.3", "KiB"]
    assert f"ago  INVALID: {name(200)}/pack-0.bin checksum mismatch (expected " in lines[0]
    assert lines[1].split()[:4] == ["100", LINEAGE, "1.3", "KiB"] and lines[1].endswith("ago  valid")
    assert lines[2] == "1 unpublished (ignored; the next writer removes them): step-000000300.tmp-abc123"


def test_list_without_verify_does_not_judge(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_checkpoints(tmp_path, [5])
    assert main(["list", "--no-verify", str(tmp_path)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("not verified")


def test_list_of_empty_directory_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"no published checkpoints in {tmp_path}\n"


def test_verify_valid_exits_0_and_invalid_exits_1_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_checkpoints(tmp_path, [100, 200])
    corrupt(tmp_path / name(200))

    assert main(["verify", str(tmp_path / name(100))]) == 0
    assert capsys.readouterr().out.startswith(f"valid: {name(100)}: 3 files, ")

    assert main(["verify", str(tmp_path / name(200))]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"INVALID: {name(200)}/pack-0.bin checksum mismatch (expected ")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param([], "the following arguments are required: command", id="no_command"),
        pytest.param(["frobnicate"], "invalid choice: 'frobnicate'", id="unknown_command"),
        pytest.param(["list", "/nonexistent/checkpoints"], "/nonexistent/checkpoints is not a directory", id="missing_dir"),
        pytest.param(["verify", "/nonexistent/step-000000001"], "pass a checkpoint such as DIR/step-000000400", id="missing_ckpt"),
    ],
)
def test_bad_arguments_print_one_line_and_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("replicaft-ckpt") and message in err

