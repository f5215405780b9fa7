"""Resume order across histories (checkpoint/lineage.py, pure) and the lineage a resume continues."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from replicaft.checkpoint import CheckpointWriter
from replicaft.checkpoint.layout import MANIFEST_FILE, is_lineage
from replicaft.checkpoint.lineage import Candidate, order_for_resume
from replicaft.checkpoint.options import CheckpointOptions, check_checkpoint_options
from replicaft.config.options import ManagerOptions
from replicaft.errors import OptionsError
from replicaft.persistence.duties import STATE_NAME, Persistence
from replicaft.state.flat import flatten
from replicaft.transfer.snapshot import Snapshot
from replicaft.transfer.spare import SpareBuffer

A, B = "aaaaaaaaaaaa", "bbbbbbbbbbbb"


@pytest.mark.parametrize(
    ("candidates", "order"),
    [
        pytest.param([], [], id="none"),
        pytest.param(
            [(10, A, 1.0), (30, A, 3.0), (20, A, 2.0)], [(30, A), (20, A), (10, A)], id="one_lineage_newest_first"
        ),
        # B was written last: all of B before any of A, though A reached a higher step.
        pytest.param(
            [(10, A, 1.0), (90, A, 2.0), (10, B, 5.0), (20, B, 6.0)],
            [(20, B), (10, B), (90, A), (10, A)],
            id="most_recent_lineage_first_whole",
        ),
        # An unreadable manifest (None) does not make a lineage recent; it is tried in step order.
        pytest.param(
            [(50, A, None), (10, A, 1.0), (20, B, 0.5)], [(50, A), (10, A), (20, B)], id="unreadable_manifest"
        ),
        pytest.param([(10, A, None), (20, B, None)], [(20, B), (10, A)], id="nothing_readable_highest_step_first"),
    ],
)
def test_order_for_resume_table(candidates: list[tuple[int, str, float | None]], order: list[tuple[int, str]]) -> None:
    decided = order_for_resume(Candidate(s, lin, t) for s, lin, t in candidates)
    assert [(c.step, c.lineage) for c in decided.candidates] == order


def test_same_step_in_two_tiers_tries_the_nearer_copy_first() -> None:
    decided = order_for_resume([Candidate(10, A, 1.0, tier=1), Candidate(10, A, 1.0, tier=0)])
    assert [c.tier for c in decided.candidates] == [0, 1]
    assert decided.reason == f"lineage {A} (step 10) is the only history here"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("keep_last", -1, "keep_last=-1 is out of range"),
        ("keep_last", 2.5, "keep_last=2.5 is a float; it must be a whole number"),
        ("milestone_every", -5, "milestone_every=-5 is out of range"),
        ("interval_steps", True, "interval_steps=True is a bool"),
        ("interval_s", float("nan"), "interval_s=nan is not a finite number of seconds"),
        ("interval_s", float("inf"), "interval_s=inf is not a finite number of seconds"),
        ("interval_s", -1.0, "interval_s=-1.0 is not a finite number of seconds"),
        ("interval_s", 1e12, "interval_s=1000000000000.0 is not a finite number of seconds"),
        ("tier2_directory", "/ckpt", "tier2_directory is the checkpoint directory itself"),
    ],
)
def test_checkpoint_options_refuse_values_that_would_fail_later(field: str, value: object, message: str) -> None:
    options = {
        "directory": "/ckpt",
        "tier2_directory": None,
        "interval_steps": 10,
        "interval_s": 0.0,
        "keep_last": 3,
        "milestone_every": 0,
    }
    with pytest.raises(OptionsError, match=message):
        check_checkpoint_options(**{**options, field: value})  # type: ignore[arg-type]


def test_checkpoint_options_accept_the_defaults() -> None:
    assert CheckpointOptions(directory="/ckpt").keep_last == 3


def saved(directory: Path, lineage: str, steps: list[int]) -> list[Path]:
    paths = []
    with CheckpointWriter(directory, lineage=lineage) as writer:
        for step in steps:
            state = {"replicaft": {"step": step}, "model": {"w": torch.full((8,), float(step))}}
            result = writer.save_async(
                Snapshot.capture(flatten(state), step=step, quorum_id=1, replica_id="g0"), step
            ).wait(60)
            assert result.path is not None
            paths.append(result.path)
    return paths


def persistence(directory: Path) -> Persistence:
    options = ManagerOptions(lighthouse="127.0.0.1:1", replica_id="g0", checkpoint_dir=str(directory))
    p = Persistence(options, lambda *a, **k: None, SpareBuffer())
    p.start()
    return p


def template() -> dict[str, object]:
    return {"replicaft": {"step": 0}, "model": {"w": torch.zeros(8)}, STATE_NAME: {"lineage": ""}}


def test_resume_continues_the_lineage_of_its_newest_checkpoint(tmp_path: Path) -> None:
    saved(tmp_path, A, [10, 20])
    p = persistence(tmp_path)
    try:
        fresh = p.lineage
        loaded = p.load_latest(template(), occasion="replicaft/1/4")
        assert loaded is not None and loaded.step == 20
        assert p.lineage == A != fresh and loaded.state[STATE_NAME] == {"lineage": A}
    finally:
        p.close()


def test_resume_from_an_older_checkpoint_forks_a_new_lineage(tmp_path: Path) -> None:
    _, newest = saved(tmp_path, A, [10, 20])
    (newest / MANIFEST_FILE).write_text(json.dumps({"damaged": True}))
    p = persistence(tmp_path)
    try:
        loaded = p.load_latest(template(), occasion="replicaft/1/4")
        assert loaded is not None and loaded.step == 10 and not loaded.newest_in_lineage
        assert p.lineage not in (A, "") and is_lineage(p.lineage) and loaded.state[STATE_NAME] == {"lineage": p.lineage}
    finally:
        p.close()


def test_a_heal_hands_over_the_lineage(tmp_path: Path) -> None:
    p = persistence(tmp_path)
    try:
        p.load_state_dict({"lineage": B})
        assert p.state_dict() == {"lineage": B}
        p.load_state_dict({"lineage": "../etc"})
        assert p.lineage == B
    finally:
        p.close()


def test_a_forked_lineage_is_the_same_for_every_group_resuming_on_one_occasion() -> None:
    from replicaft.checkpoint.layout import forked_lineage, is_lineage

    fork = forked_lineage("0123456789abcdef", 20, "replicaft/3/17")
    assert is_lineage(fork) and fork == forked_lineage("0123456789abcdef", 20, "replicaft/3/17")
    assert fork != forked_lineage("0123456789abcdef", 20, "replicaft/3/18")  # a later resume forks anew
    assert fork != forked_lineage("0123456789abcdef", 10, "replicaft/3/17")
