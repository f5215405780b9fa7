"""The exactly-once assignment: pure rules, table tests and properties."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from replicaft.data import assign_share, epoch_permutation, sample_ids, shard_share
from replicaft.deterministic.rules import owned_shards


def test_per_group_shares_are_disjoint_and_contiguous() -> None:
    shares = [
        assign_share(100, batch_size=8, policy="per_group", num_contributors=3, contributor_rank=r) for r in range(3)
    ]
    assert [(s.start, s.stop) for s in shares] == [(100, 108), (108, 116), (116, 124)]
    assert all(s.step_stop == 124 and s.loss_scale == 1.0 for s in shares)


def test_healer_takes_no_samples_but_knows_the_step_range() -> None:
    s = assign_share(40, batch_size=8, policy="per_group", num_contributors=2, contributor_rank=None)
    assert s.num_samples == 0 and (s.step_start, s.step_stop) == (40, 56)


def test_global_policy_splits_unevenly_with_loss_scale_correcting_the_mean() -> None:
    shares = [assign_share(0, batch_size=10, policy="global", num_contributors=3, contributor_rank=r) for r in range(3)]
    assert [s.num_samples for s in shares] == [4, 3, 3]
    assert abs(sum(s.loss_scale for s in shares) / 3 - 1.0) < 1e-9
    assert shares[0].loss_scale > 1.0 > shares[1].loss_scale


def test_ranks_of_a_group_split_the_group_share() -> None:
    shares = [
        assign_share(
            0,
            batch_size=8,
            policy="per_group",
            num_contributors=2,
            contributor_rank=1,
            group_rank=r,
            group_world_size=2,
        )
        for r in range(2)
    ]
    assert [(s.start, s.stop) for s in shares] == [(8, 12), (12, 16)]


def test_batches_span_epoch_boundaries_without_loss() -> None:
    ids = sample_ids(8, 14, dataset_len=10, seed=3)
    assert ids[:2] == epoch_permutation(0, 10, 3)[8:].tolist()
    assert ids[2:] == epoch_permutation(1, 10, 3)[:4].tolist()


def test_every_epoch_is_a_permutation() -> None:
    ids = sample_ids(0, 30, dataset_len=10, seed=0)
    for e in range(3):
        assert sorted(ids[e * 10 : (e + 1) * 10]) == list(range(10))


@given(
    st.lists(
        st.tuples(st.integers(1, 5), st.booleans()),  # (contributors this step, committed?)
        min_size=1,
        max_size=40,
    ),
    st.integers(1, 16),
    st.sampled_from(["per_group", "global"]),
)
def test_committed_steps_cover_a_prefix_exactly_once(steps: list[tuple[int, bool]], batch: int, policy: str) -> None:
    cursor = 0
    covered: list[int] = []
    for contributors, committed in steps:
        shares = [
            assign_share(cursor, batch_size=batch, policy=policy, num_contributors=contributors, contributor_rank=r)
            for r in range(contributors)
        ]
        if committed:
            for s in shares:
                covered.extend(range(s.start, s.stop))
            cursor = shares[0].step_stop
    assert sorted(covered) == list(range(cursor))


def test_deterministic_share_is_the_run_of_owned_shards_with_loss_scale_their_count() -> None:
    s = shard_share(240, batch_size=24, num_shards=6, shards=range(2, 4))
    assert (s.step_start, s.step_stop, s.start, s.stop, s.loss_scale) == (240, 264, 248, 256, 2.0)


def test_deterministic_share_of_a_group_without_shards_is_empty_but_spans_the_step() -> None:
    s = shard_share(24, batch_size=24, num_shards=6, shards=range(0))
    assert s.num_samples == 0 and (s.step_start, s.step_stop) == (24, 48)


@given(st.integers(0, 1000), st.integers(1, 12), st.integers(1, 8), st.integers(1, 6))
def test_deterministic_shares_cover_the_global_batch_whatever_the_contributors(
    cursor: int, shard_size: int, num_shards: int, num_groups: int
) -> None:
    batch = shard_size * num_shards
    groups = [f"g{i}" for i in range(num_groups)]
    shares = [
        shard_share(cursor, batch_size=batch, num_shards=num_shards, shards=owned_shards(num_shards, groups, g))
        for g in groups
    ]
    covered = sorted(p for s in shares for p in range(s.start, s.stop))
    assert covered == list(range(cursor, cursor + batch))
