"""``replicaft-ckpt`` / ``python -m replicaft.checkpoint``: list, verify, exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from replicaft.checkpoint import CheckpointWriter
from replicaft.checkpoint.__main__ import main
from replicaft.checkpoint.labels import CheckpointLabels
from replicaft.checkpoint.layout import checkpoint_dirname
from replicaft.checkpoint.manifest import FORMAT_VERSION
from replicaft.state.flat import flatten
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
    assert lines[2] == "1 unpublished (ignored; the next writer removes those abandoned): step-000000300.tmp-abc123"


def test_list_without_verify_does_not_judge(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_checkpoints(tmp_path, [5])
    assert main(["list", "--no-verify", str(tmp_path)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("not verified")


def test_list_of_empty_directory_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"no published checkpoints in {tmp_path}\n"


def test_verify_valid_exits_0_and_invalid_exits_1_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
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
        pytest.param(
            ["list", "/nonexistent/checkpoints"], "/nonexistent/checkpoints is not a directory", id="missing_dir"
        ),
        pytest.param(
            ["verify", "/nonexistent/step-000000001"], "pass a checkpoint such as DIR/step-000000400", id="missing_ckpt"
        ),
    ],
)
def test_bad_arguments_print_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("replicaft-ckpt") and message in err


# -- the catalog: catalog, find, show, tag ----------------------------------------------------


def write_labelled(directory: Path, losses: dict[int, float], experiment: str = "sweep") -> None:
    labels = CheckpointLabels()
    labels.set_tags(experiment=experiment)
    with CheckpointWriter(directory, lineage=LINEAGE, keep_last=10) as writer:
        for step, loss in losses.items():
            labels.report_metrics(loss=loss)
            snap = Snapshot.capture(
                flatten({"model": {"w": torch.full((256,), float(step))}}), step=step, quorum_id=1, replica_id="g0"
            )
            assert writer.save_async(snap, step, labels.take()).wait(60).ok


def first_column(out: str) -> list[str]:
    return [line.split()[0] for line in out.splitlines()]


def test_catalog_find_show_and_tag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_labelled(tmp_path, {100: 0.9, 200: 0.2, 300: 0.4})
    assert main(["catalog", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert first_column("\n".join(lines)) == [name(300), name(200), name(100)]
    assert lines[0].split()[1:4] == ["300", "-", "sweep"] and lines[0].endswith("loss=0.4")

    assert main(["find", str(tmp_path), "--experiment", "sweep", "--best", "loss"]) == 0
    assert first_column(capsys.readouterr().out) == [name(200)]
    assert main(["find", str(tmp_path), "--best", "loss", "--mode", "max", "--top", "2"]) == 0
    assert first_column(capsys.readouterr().out) == [name(100), name(300)]
    assert main(["find", str(tmp_path), "--min-step", "150", "--max-step", "250"]) == 0
    assert first_column(capsys.readouterr().out) == [name(200)]
    assert main(["find", str(tmp_path), "--experiment", "other"]) == 1
    assert capsys.readouterr().out == f"no checkpoint in {tmp_path} matches\n"

    assert main(["tag", str(tmp_path / name(100)), "note=first try", "epoch=0"]) == 0
    assert capsys.readouterr().out == f"tagged {name(100)}: note=first try, epoch=0\n"
    assert main(["find", str(tmp_path), "--tag", "note=first try"]) == 0
    assert first_column(capsys.readouterr().out) == [name(100)]

    assert main(["show", str(tmp_path / name(100))]) == 0
    out = capsys.readouterr().out.splitlines()
    assert {
        "step: 100",
        "epoch: 0",
        f"lineage: {LINEAGE}",
        "experiment: sweep",
        "roles: latest",
        "tiers: local",
        "kind: base",
        f"format version: {FORMAT_VERSION}",
        "metric loss: 0.9",
        "tag note: first try",
    } <= set(out), out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["tag", "{dir}/" + name(100), "novalue"], "'novalue' is not KEY=VALUE", id="tag_not_key_value"),
        pytest.param(
            ["tag", "{dir}/" + name(100), "epoch=-1"], "epoch='-1' must be a whole number", id="tag_bad_epoch"
        ),
        pytest.param(["tag", "{dir}/" + name(999), "a=b"], f"{name(999)} is not in the catalog", id="tag_unknown"),
        pytest.param(["show", "{dir}/notes"], "is not a checkpoint name", id="show_not_a_checkpoint"),
        pytest.param(["find", "{dir}/missing"], "missing is not a directory", id="find_missing_dir"),
    ],
)
def test_bad_catalog_arguments_exit_2_with_the_value(
    tmp_path: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    write_labelled(tmp_path, {100: 0.5})
    capsys.readouterr()
    argv = [a.replace("{dir}", str(tmp_path)) for a in argv]
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_find_from_a_shell_rebuilds_a_missing_catalog_with_a_warning(tmp_path: Path) -> None:
    write_labelled(tmp_path, {100: 0.3, 200: 0.1, 300: 0.2})
    (tmp_path / "catalog.sqlite").unlink()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "replicaft.checkpoint",
            "find",
            str(tmp_path),
            "--experiment",
            "sweep",
            "--best",
            "loss",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert first_column(done.stdout) == [name(200)]
    assert "warning: " in done.stderr and "catalog.sqlite is missing; rebuilt it from the manifests of 3" in done.stderr
