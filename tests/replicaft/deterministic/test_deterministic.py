"""The deterministic mode's rules: shards, seeds, and the exact fixed-point sum (pure)."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from replicaft.deterministic.rules import (
    INT_BITS,
    check_shards,
    decode_mean,
    encode,
    encode_sum,
    headroom_bits,
    max_abs,
    owned_shards,
    quantisation_bound,
    scale_exponent,
    shard_bounds,
    shard_seed,
)
from replicaft.errors import OptionsError


@pytest.mark.parametrize(
    ("num_shards", "contributors", "expected"),
    [
        (8, ["g0", "g1", "g2"], {"g0": range(0, 3), "g1": range(3, 6), "g2": range(6, 8)}),
        (8, ["g2", "g0"], {"g0": range(0, 4), "g2": range(4, 8)}),
        (8, ["g1"], {"g1": range(0, 8)}),
        (2, ["g0", "g1", "g2"], {"g0": range(0, 1), "g1": range(1, 2), "g2": range(0)}),
        (4, ["b", "a", "c", "d"], {"a": range(0, 1), "b": range(1, 2), "c": range(2, 3), "d": range(3, 4)}),
    ],
)
def test_shards_dealt_by_sorted_replica_id(
    num_shards: int, contributors: list[str], expected: dict[str, range]
) -> None:
    assert {rid: owned_shards(num_shards, contributors, rid) for rid in contributors} == expected


def test_non_contributor_owns_no_shard() -> None:
    assert owned_shards(8, ["g0", "g1"], "g2") == range(0)


@given(st.integers(1, 64), st.lists(st.text("abcdefg", min_size=1, max_size=3), min_size=1, max_size=20, unique=True))
def test_every_shard_owned_exactly_once_whatever_the_membership(num_shards: int, contributors: list[str]) -> None:
    owned = [s for rid in contributors for s in owned_shards(num_shards, contributors, rid)]
    assert sorted(owned) == list(range(num_shards))


def test_shard_bounds_cut_the_global_batch_into_equal_runs() -> None:
    assert [shard_bounds(100, 12, 4, s) for s in range(4)] == [(100, 103), (103, 106), (106, 109), (109, 112)]


def test_batch_not_divisible_by_shards_names_the_fix() -> None:
    with pytest.raises(OptionsError, match=r"batch_size=10 is not a multiple of virtual_shards=4.*batch_size of 12"):
        check_shards(10, 4)
    with pytest.raises(OptionsError, match="virtual_shards=0"):
        check_shards(10, 0)


def test_shard_seed_depends_on_seed_step_and_shard_only() -> None:
    seeds = {shard_seed(a, b, c) for a in range(2) for b in range(3) for c in range(4)}
    assert len(seeds) == 24 and all(0 <= s < 2**63 for s in seeds)
    assert shard_seed(7, 3, 2) == shard_seed(7, 3, 2)


@pytest.mark.parametrize(("num_shards", "bits"), [(1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (8, 3), (9, 4), (1024, 10)])
def test_headroom_is_ceil_log2_of_shards(num_shards: int, bits: int) -> None:
    assert headroom_bits(num_shards) == bits


@pytest.mark.parametrize(
    ("agreed_max", "num_shards", "k"),
    [(1.0, 8, 62 - 3 - 1), (0.75, 8, 62 - 3 - 0), (3.0, 1, 62 - 2), (0.0, 8, 0), (2.0**-30, 2, 62 - 1 + 29)],
)
def test_scale_is_the_largest_power_of_two_that_cannot_overflow(agreed_max: float, num_shards: int, k: int) -> None:
    assert scale_exponent(agreed_max, num_shards) == k


def test_non_finite_maximum_has_no_scale() -> None:
    with pytest.raises(ValueError, match="agreed_max=inf"):
        scale_exponent(math.inf, 4)


def test_max_abs_reports_inf_for_any_non_finite_value() -> None:
    assert max_abs([torch.tensor([1.0, -3.0]), torch.tensor([2.0])]) == 3.0
    assert max_abs([torch.tensor([1.0, float("nan")])]) == math.inf
    assert max_abs([torch.tensor([]), torch.zeros(0)]) == 0.0


@pytest.mark.parametrize("num_shards", [1, 2, 3, 7, 8, 64, 1000])
def test_worst_case_sum_cannot_overflow(num_shards: int) -> None:
    top = torch.tensor([3.4e38, -3.4e38, 1.0], dtype=torch.float32)
    k = scale_exponent(max_abs([top]), num_shards)
    total = encode_sum([top] * num_shards, k, top)
    assert int(total.abs().max()) <= 2**INT_BITS
    mean = decode_mean(total, k, num_shards, torch.float32)
    assert torch.equal(mean[:2], top[:2])


def _partition(rng: random.Random, items: list[int], parts: int) -> list[list[int]]:
    rng.shuffle(items)
    cuts = sorted(rng.sample(range(1, len(items)), parts - 1)) if parts > 1 else []
    return [items[a:b] for a, b in zip([0, *cuts], [*cuts, len(items)], strict=True)]


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 16), st.integers(0, 2**32 - 1), st.sampled_from([torch.float32, torch.float64]))
def test_any_grouping_and_order_gives_the_same_bits(num_shards: int, seed: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(-8, 3, 37, dtype=torch.float64).to(dtype)
    shards = [torch.randn(37, generator=g, dtype=dtype) * scales for _ in range(num_shards)]
    k = scale_exponent(max_abs(shards), num_shards)
    rng = random.Random(seed)
    results = []
    for _ in range(4):
        groups = _partition(rng, list(range(num_shards)), rng.randint(1, num_shards))
        partials = [encode_sum([shards[i] for i in group], k, shards[0]) for group in groups]
        rng.shuffle(partials)
        total = torch.zeros_like(partials[0])
        for p in partials:
            total += p
        results.append(decode_mean(total, k, num_shards, dtype))
    assert all(torch.equal(results[0], r) for r in results[1:])


def test_float_sums_depend_on_grouping_where_the_exact_sum_does_not() -> None:
    shards = [torch.tensor([1.0], dtype=torch.float32), torch.tensor([2.0**-24]), torch.tensor([2.0**-24])]
    left = (shards[0] + shards[1]) + shards[2]
    right = shards[0] + (shards[1] + shards[2])
    assert not torch.equal(left, right)  # the problem this module removes
    k = scale_exponent(max_abs(shards), 3)
    a = encode_sum([shards[0]], k, shards[0]) + encode_sum(shards[1:], k, shards[0])
    b = encode_sum(shards[:2], k, shards[0]) + encode_sum(shards[2:], k, shards[0])
    assert torch.equal(decode_mean(a, k, 3, torch.float32), decode_mean(b, k, 3, torch.float32))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 32), st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=32), min_size=1, max_size=8))
def test_decoded_mean_is_within_the_documented_bound(num_shards: int, values: list[float]) -> None:
    shards = [torch.tensor(values, dtype=torch.float32) * (i + 1) / num_shards for i in range(num_shards)]
    agreed = max_abs(shards)
    k = scale_exponent(agreed, num_shards)
    mean = decode_mean(encode_sum(shards, k, shards[0]), k, num_shards, torch.float64)
    bound = quantisation_bound(agreed, num_shards)
    for j in range(len(values)):
        exact = sum(Fraction(float(s[j])) for s in shards) / num_shards
        # the fixed-point bound, plus float64's two roundings (int -> float, the division)
        slack = bound + 2 * 2.0**-52 * abs(float(exact))
        assert abs(Fraction(float(mean[j])) - exact) <= Fraction(slack)


def test_bound_is_tiny_next_to_float32_rounding() -> None:
    assert quantisation_bound(1.0, 8) == 2.0**-59
    assert quantisation_bound(0.0, 8) == 0.0


def test_encoding_rounds_half_to_even_once() -> None:
    assert encode(torch.tensor([0.5, 1.5, 2.5, -0.5]), 0).tolist() == [0, 2, 2, 0]


def test_tiny_float64_buffers_scale_without_overflow() -> None:
    t = torch.tensor([1e-300, -3e-301], dtype=torch.float64)
    k = scale_exponent(max_abs([t]), 4)
    assert k > 1024
    assert torch.equal(decode_mean(encode_sum([t] * 4, k, t), k, 4, torch.float64), t)
