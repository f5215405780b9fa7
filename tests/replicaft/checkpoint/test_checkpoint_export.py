"""``replicaft-ckpt export --format safetensors`` and ``import`` (checkpoint/export.py, issue 22)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors
import safetensors.torch
import torch

from replicaft.checkpoint import CheckpointReader, CheckpointWriter
from replicaft.checkpoint.__main__ import main
from replicaft.config.options import ManagerOptions
from replicaft.persistence.duties import Persistence
from replicaft.state.flat import digest, flatten
from replicaft.transfer.snapshot import Snapshot
from replicaft.transfer.spare import SpareBuffer


def trained() -> tuple[torch.nn.Module, torch.optim.Optimizer, dict[str, object]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(5, 8)).pow(2).sum().backward()
        optimizer.step()
    state = {
        "replicaft": {"step": 2},
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "data_cursor": {"position": 64},
    }
    return model, optimizer, state


def saved(directory: Path, state: dict[str, object]) -> None:
    with CheckpointWriter(directory) as writer:
        assert writer.save_async(Snapshot.capture(flatten(state), step=2, quorum_id=1, replica_id="g0"), 2).wait(60).ok


def test_exported_model_loads_in_plain_torch_and_optimizer_carries_param_groups(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, optimizer, state = trained()
    saved(tmp_path / "ckpt", state)

    assert (
        main(
            ["export", str(tmp_path / "ckpt"), "--format", "safetensors", "--out", str(tmp_path / "out"), "--optimizer"]
        )
        == 0
    )
    assert "model.safetensors (step 2," in capsys.readouterr().out

    other = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    other.load_state_dict(safetensors.torch.load_file(str(tmp_path / "out" / "model.safetensors")))
    assert all(a.equal(b) for a, b in zip(other.state_dict().values(), model.state_dict().values(), strict=True))
    with safetensors.safe_open(str(tmp_path / "out" / "optimizer.safetensors"), framework="pt") as f:
        assert json.loads(f.metadata()["param_groups"])[0]["lr"] == 0.01
        assert f.get_tensor("state[0].exp_avg").equal(optimizer.state_dict()["state"][0]["exp_avg"])


def test_export_then_import_restores_the_entries_exactly_and_a_resume_keeps_the_rest(tmp_path: Path) -> None:
    _, _, state = trained()
    saved(tmp_path / "ckpt", state)
    assert main(["export", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out"), "--optimizer"]) == 0
    files = [str(tmp_path / "out" / f) for f in ("model.safetensors", "optimizer.safetensors")]
    assert main(["import", *files, "--into", str(tmp_path / "warm"), "--step", "2"]) == 0

    loaded = CheckpointReader(tmp_path / "warm").load_latest_valid()
    assert loaded is not None and loaded.imported and sorted(loaded.state) == ["model", "optimizer", "replicaft"]
    for entry in ("model", "optimizer"):
        assert digest(flatten(loaded.state[entry])) == digest(flatten(state[entry]))

    options = ManagerOptions(lighthouse="127.0.0.1:1", replica_id="g0", checkpoint_dir=str(tmp_path / "warm"))
    persistence = Persistence(options, lambda *a, **k: None, SpareBuffer())
    persistence.start()
    try:
        resumed = persistence.load_latest({**trained()[2], "data_cursor": {"position": 0}}, occasion="warm start")
    finally:
        persistence.close()
    assert resumed is not None and resumed.state["data_cursor"] == {"position": 0}  # the job's own, kept


def test_a_foreign_safetensors_file_imports_as_a_flat_model(tmp_path: Path) -> None:
    model, _, _ = trained()
    safetensors.torch.save_file(model.state_dict(), str(tmp_path / "model.safetensors"))
    assert main(["import", str(tmp_path / "model.safetensors"), "--into", str(tmp_path / "warm")]) == 0
    loaded = CheckpointReader(tmp_path / "warm").load_latest_valid()
    assert loaded is not None and loaded.step == 0
    fresh = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    fresh.load_state_dict(loaded.state["model"])
    assert fresh.state_dict()["0.weight"].equal(model.state_dict()["0.weight"])


def test_import_of_a_file_that_is_not_safetensors_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 64)
    assert main(["import", str(tmp_path / "model.safetensors"), "--into", str(tmp_path / "warm")]) == 1
    assert "is not a safetensors file" in capsys.readouterr().out


def test_encrypted_checkpoint_exports_only_with_its_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    key = bytes(range(32)).hex()
    monkeypatch.setenv("REPLICAFT_CHECKPOINT_KEY", key)
    _, _, state = trained()
    assert main(["import", *_exported(tmp_path, state), "--into", str(tmp_path / "enc")]) == 0
    monkeypatch.delenv("REPLICAFT_CHECKPOINT_KEY")

    with pytest.raises(SystemExit) as refused:
        main(["export", str(tmp_path / "enc"), "--out", str(tmp_path / "again")])
    assert refused.value.code == 2 and "is encrypted" in capsys.readouterr().err
    monkeypatch.setenv("REPLICAFT_CHECKPOINT_KEY", key)
    assert main(["export", str(tmp_path / "enc"), "--out", str(tmp_path / "again")]) == 0
    again = safetensors.torch.load_file(str(tmp_path / "again" / "model.safetensors"))
    model = state["model"]
    assert isinstance(model, dict) and sorted(again) == sorted(model)
    assert all(again[name].equal(model[name]) for name in model)


def _exported(tmp_path: Path, state: dict[str, object]) -> list[str]:
    saved(tmp_path / "plain", state)
    assert main(["export", str(tmp_path / "plain"), "--out", str(tmp_path / "out")]) == 0
    return [str(tmp_path / "out" / "model.safetensors")]
