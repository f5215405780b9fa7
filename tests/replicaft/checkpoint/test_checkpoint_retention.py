"""Retention (replicaft/checkpoint/retention.py): every rule alone and combined; chains and
pending uploads always kept; the newest never deleted; a reason for every checkpoint. Then
the writer applying it with a real object-store upload in flight."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from chaos.s3_server import S3Server
from replicaft.checkpoint import CheckpointWriter
from replicaft.checkpoint.objectstore import ObjectStore
from replicaft.checkpoint.options import CheckpointOptions, RetentionPolicy
from replicaft.checkpoint.retention import CheckpointFacts, decide_retention
from replicaft.checkpoint.retry import RetryPolicy
from replicaft.errors import OptionsError
from replicaft.state.flat import flatten
from replicaft.transfer.snapshot import Snapshot

MIB = 1024 * 1024


def facts(*steps: int, **per_step: dict[int, Any]) -> list[CheckpointFacts]:
    """Facts for ``steps``; ``epoch={step: e}``, ``loss={step: v}``, ``requires={step: [..]}``,
    ``pending=[steps]`` fill in the rest."""
    epochs, losses = per_step.get("epoch", {}), per_step.get("loss", {})
    requires, pending = per_step.get("requires", {}), per_step.get("pending", ())
    return [
        CheckpointFacts(
            s, epochs.get(s), {"loss": losses[s]} if s in losses else {}, tuple(requires.get(s, ())), s in pending
        )
        for s in steps
    ]


KEEP_LAST_AND_MILESTONES = [
    # (published steps, keep_last, milestone_every, expected deleted)
    pytest.param([], 3, 0, [], id="nothing_published_nothing_deleted"),
    pytest.param([100, 200], 3, 0, [], id="fewer_than_keep_last_all_kept"),
    pytest.param([100, 200, 300, 400, 500], 2, 0, [100, 200, 300], id="keeps_newest_k"),
    pytest.param([100, 200, 300, 400, 500], 2, 200, [100, 300], id="keeps_milestones_outside_recent_window"),
    pytest.param([500, 100, 300, 200, 400], 2, 200, [100, 300], id="input_order_does_not_matter"),
    pytest.param([100, 200, 300], 0, 0, [100, 200], id="keep_last_zero_still_keeps_newest"),
    pytest.param([100, 200, 300], 0, 100, [], id="keep_last_zero_keeps_milestones"),
    pytest.param([1000, 1100, 1200, 2000], 1, 1000, [1100, 1200], id="newest_is_milestone"),
    pytest.param([0, 50, 100], 1, 1000, [50], id="step_zero_is_a_milestone"),
    pytest.param([7], 0, 0, [], id="single_checkpoint_never_deleted"),
]


@pytest.mark.parametrize(("steps", "keep_last", "milestone_every", "deleted"), KEEP_LAST_AND_MILESTONES)
def test_keep_last_and_milestones_table(
    steps: list[int], keep_last: int, milestone_every: int, deleted: list[int]
) -> None:
    decision = decide_retention(facts(*steps), RetentionPolicy(keep_last=keep_last, milestone_every=milestone_every))
    assert list(decision.delete) == deleted
    assert sorted(decision.keep + decision.delete) == sorted(steps)


STEPS = (100, 200, 300, 400, 500, 600, 700, 800)
EPOCHS = {100: 0, 200: 0, 300: 1, 400: 1, 500: 1, 600: 2, 700: 2, 800: 3}
LOSSES = {100: 0.9, 200: 0.5, 300: 0.7, 400: 0.2, 500: 0.6, 600: 0.2, 700: 0.8, 800: 0.4}
COMBINATIONS = [
    # (policy fields, extra facts, expected kept steps)
    pytest.param({"keep_last": 1}, {}, [800], id="keep_last_only"),
    pytest.param({"keep_last": 1, "milestone_at_epoch_end": True}, {}, [200, 500, 700, 800], id="epoch_ends"),
    pytest.param({"keep_last": 1, "keep_geometric_from": 100}, {}, [100, 200, 400, 800], id="geometric_on_the_marks"),
    pytest.param(
        {"keep_last": 1, "keep_geometric_from": 150}, {}, [200, 300, 600, 800], id="geometric_first_after_marks"
    ),
    pytest.param(
        {"keep_last": 1, "keep_best_k": 2, "keep_best_metric": "loss"},
        {},
        [400, 600, 800],
        id="best_two_by_loss_tie_goes_to_newer",
    ),
    pytest.param(
        {"keep_last": 1, "keep_best_k": 1, "keep_best_metric": "loss", "keep_best_mode": "max"},
        {},
        [100, 800],
        id="best_by_max",
    ),
    pytest.param(
        {"keep_last": 1, "keep_best_k": 3, "keep_best_metric": "accuracy"},
        {},
        [800],
        id="best_by_a_metric_nobody_reported_keeps_none",
    ),
    pytest.param(
        {
            "keep_last": 2,
            "milestone_every": 300,
            "milestone_at_epoch_end": True,
            "keep_geometric_from": 400,
            "keep_best_k": 1,
            "keep_best_metric": "loss",
        },
        {},
        [200, 300, 400, 500, 600, 700, 800],
        id="every_rule_a_checkpoint_is_kept_if_any_keeps_it",
    ),
    pytest.param({"keep_last": 1}, {"pending": [300, 500]}, [300, 500, 800], id="pending_uploads_kept"),
    pytest.param({"keep_last": 1}, {"requires": {800: [600, 700]}}, [600, 700, 800], id="chain_of_newest_kept"),
    pytest.param(
        {"keep_last": 1, "keep_best_k": 1, "keep_best_metric": "loss"},
        {"requires": {600: [500], 800: [700]}},
        [500, 600, 700, 800],
        id="chain_of_best_kept",
    ),
    pytest.param(
        {"keep_last": 1},
        {"pending": [300], "requires": {300: [100, 200]}},
        [100, 200, 300, 800],
        id="chain_of_pending_upload_kept",
    ),
    pytest.param({"keep_last": 1}, {"requires": {500: [400]}}, [800], id="chain_of_deleted_checkpoint_deleted_too"),
]


@pytest.mark.parametrize(("fields", "extra", "kept"), COMBINATIONS)
def test_policy_combinations_table(fields: dict[str, Any], extra: dict[str, Any], kept: list[int]) -> None:
    decision = decide_retention(facts(*STEPS, epoch=EPOCHS, loss=LOSSES, **extra), RetentionPolicy(**fields))
    assert list(decision.keep) == kept, decision.reason
    assert [v.step for v in decision.verdicts] == list(STEPS)
    assert all(v.reason.startswith("keep: " if v.keep else "delete: ") for v in decision.verdicts)


def test_each_verdict_names_every_rule_that_keeps_it() -> None:
    policy = RetentionPolicy(keep_last=1, milestone_every=400, keep_best_k=2, keep_best_metric="loss")
    decision = decide_retention(facts(*STEPS, loss=LOSSES, requires={800: [400]}, pending=[400]), policy)
    verdicts = {v.step: v for v in decision.verdicts}
    assert verdicts[400].kept_as == ("milestone", "best", "pending_upload", "chain")
    assert verdicts[400].reason == (
        "keep: a milestone (every 400 steps); loss=0.2 is number 2 of the best 2 (min); "
        "its upload to the object store is pending; in the chain of step 800"
    )
    assert verdicts[100].reason == "delete: not among the newest 1 and kept by no other rule"


def test_summary_names_each_rule_once_and_the_deleted() -> None:
    decision = decide_retention(facts(100, 200, 300, 400, 500), RetentionPolicy(keep_last=2, milestone_every=200))
    assert decision.reason == "keep newest 2 [400, 500] and milestones every 200 [200]; delete [100, 300]"


def test_epoch_end_is_decided_only_once_a_later_epoch_exists() -> None:
    policy = RetentionPolicy(keep_last=0, milestone_at_epoch_end=True)
    assert decide_retention(facts(10, 20, epoch={10: 0, 20: 0}), policy).keep == (20,)
    assert decide_retention(facts(10, 20, 30, epoch={10: 0, 20: 0, 30: 1}), policy).keep == (20, 30)
    assert decide_retention(facts(20, 30, 40, epoch={20: 0, 30: 1, 40: 1}), policy).keep == (20, 40)


def test_checkpoints_without_epoch_or_metric_take_no_part() -> None:
    policy = RetentionPolicy(keep_last=1, milestone_at_epoch_end=True, keep_best_k=5, keep_best_metric="loss")
    decision = decide_retention(facts(10, 20, 30, epoch={10: 0, 30: 1}, loss={20: float("nan")}), policy)
    assert decision.keep == (10, 30)


def test_duplicate_steps_rejected() -> None:
    with pytest.raises(ValueError, match=r"steps \[100\] more than once"):
        decide_retention(facts(100, 100, 200), RetentionPolicy())


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"keep_last": -1}, "keep_last=-1 is out of range"),
        ({"milestone_every": -5}, "milestone_every=-5 is out of range"),
        ({"keep_geometric_from": 2.5}, "keep_geometric_from=2.5 is a float"),
        ({"milestone_at_epoch_end": 1}, "milestone_at_epoch_end=1 must be True or False"),
        ({"keep_best_k": 2}, "keep_best_k=2 needs keep_best_metric"),
        ({"keep_best_metric": "loss"}, "keep_best_metric='loss' is set but keep_best_k=0"),
        ({"keep_best_k": 1, "keep_best_metric": ""}, "keep_best_metric='' must be a metric name"),
        ({"keep_best_k": 1, "keep_best_metric": "loss", "keep_best_mode": "lowest"}, "keep_best_mode='lowest' must be"),
    ],
)
def test_bad_retention_options_rejected_at_construction(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionsError, match=message):
        RetentionPolicy(**fields)
    with pytest.raises(OptionsError, match=message):
        CheckpointOptions(directory="/ckpt", **fields)


@given(
    steps=st.sets(st.integers(0, 10_000), max_size=30),
    keep_last=st.integers(0, 10),
    milestone_every=st.integers(0, 500),
    geometric=st.integers(0, 3000),
    best_k=st.integers(0, 3),
    pending=st.sets(st.integers(0, 10_000), max_size=5),
)
def test_retention_never_deletes_newest_recent_milestones_best_or_pending(
    steps: set[int], keep_last: int, milestone_every: int, geometric: int, best_k: int, pending: set[int]
) -> None:
    policy = RetentionPolicy(
        keep_last=keep_last,
        milestone_every=milestone_every,
        keep_geometric_from=geometric,
        keep_best_k=best_k,
        keep_best_metric="loss" if best_k else None,
    )
    ordered = sorted(steps)
    chains = {s: [p for p in ordered if p < s][-2:] for s in ordered[1::3]}
    given_facts = facts(*ordered, loss={s: (s * 7919) % 101 for s in ordered}, requires=chains, pending=pending)
    decision = decide_retention(given_facts, policy)
    keep = set(decision.keep)
    assert keep | set(decision.delete) == steps and not keep & set(decision.delete)
    if ordered:
        assert ordered[-1] in keep
    assert set(ordered[-keep_last:] if keep_last else []) <= keep
    assert all(milestone_every == 0 or s % milestone_every for s in decision.delete)
    assert steps & pending <= keep
    assert all(set(chains.get(s, ())) <= keep for s in keep)
    ranked = sorted(ordered, key=lambda s: ((s * 7919) % 101, -s))[:best_k]
    assert set(ranked) <= keep


# -- the writer applies it: a pending upload is not deleted (real files, a real S3 server) -----


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    for key, value in (
        ("AWS_ACCESS_KEY_ID", "replicaft"),
        ("AWS_SECRET_ACCESS_KEY", "replicaft"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(key, value)
    server = S3Server(buckets=["retention"]).start()
    yield server
    server.close()


def test_writer_keeps_checkpoints_whose_upload_is_pending(s3: S3Server, tmp_path: Path) -> None:
    store = ObjectStore(
        f"s3://retention/{tmp_path.name}",
        endpoint_url=s3.endpoint,
        part_bytes=5 * MIB,
        retry=RetryPolicy(base_delay_s=0.05, max_delay_s=1.0, deadline_s=60.0),
    )
    frozen = torch.arange(6 * MIB // 4, dtype=torch.float32)  # two parts, each held back 1.5 s by the server
    s3.faults(delay_parts_s=1.5)

    def save(writer: CheckpointWriter, step: int) -> tuple[int, ...]:
        snap = Snapshot.capture(
            flatten({"model": {"frozen": frozen, "head": torch.full((8,), float(step))}}),
            step=step,
            quorum_id=1,
            replica_id="g0",
        )
        result = writer.save_async(snap, step).wait(60)
        assert result.ok, result.reason
        return result.deleted_steps

    with CheckpointWriter(tmp_path / "ckpt", keep_last=1, chain_length=1, object_store=store) as writer:
        assert writer.uploader is not None
        assert [save(writer, step) for step in (10, 20, 30)] == [(), (), ()], "uploads pending: nothing deleted"
        assert len(writer.uploader.pending_names()) >= 2
        s3.faults(delay_parts_s=0)
        assert writer.uploader.wait_idle(60)
        assert save(writer, 40) == (10, 20, 30)


def test_manager_options_retention_rules_reach_the_writer_issue_23(tmp_path: Path) -> None:
    # ManagerOptions (from the environment, as entry points build it) -> Persistence -> the
    # CheckpointWriter's policy, which its object-store uploader shares (writer.py).
    from replicaft.config.options import ManagerOptions
    from replicaft.persistence.duties import Persistence
    from replicaft.transfer.spare import SpareBuffer

    env = {
        "REPLICAFT_LIGHTHOUSE": "127.0.0.1:1",
        "REPLICAFT_REPLICA_ID": "g0",
        "REPLICAFT_CHECKPOINT_DIR": str(tmp_path),
        "REPLICAFT_CHECKPOINT_KEEP_LAST": "2",
        "REPLICAFT_CHECKPOINT_MILESTONE_EVERY": "1000",
        "REPLICAFT_CHECKPOINT_MILESTONE_AT_EPOCH_END": "1",
        "REPLICAFT_CHECKPOINT_KEEP_GEOMETRIC_FROM": "50",
        "REPLICAFT_CHECKPOINT_KEEP_BEST_K": "3",
        "REPLICAFT_CHECKPOINT_KEEP_BEST_METRIC": "accuracy",
        "REPLICAFT_CHECKPOINT_KEEP_BEST_MODE": "max",
    }
    persistence = Persistence(ManagerOptions.from_env(env), lambda *a, **k: None, SpareBuffer())
    persistence.start()
    try:
        assert persistence._writer is not None
        assert persistence._writer.retention == RetentionPolicy(
            keep_last=2,
            milestone_every=1000,
            milestone_at_epoch_end=True,
            keep_geometric_from=50,
            keep_best_k=3,
            keep_best_metric="accuracy",
            keep_best_mode="max",
        )
    finally:
        persistence.close()
