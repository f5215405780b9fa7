"""The memory reserve a warm standby faults in for a restarted group (replicaft/process/reserve.py)."""

from __future__ import annotations

import resource

import pytest
import torch

from replicaft.process import reserve
from replicaft.process.reserve import ALIGNMENT, MemoryReserve


@pytest.fixture
def no_reserve(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts, and leaves the process, without an installed reserve."""
    monkeypatch.setattr(reserve, "_reserve", None)


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def test_taken_tensors_are_zeros_aligned_disjoint_and_of_the_asked_dtype() -> None:
    held = MemoryReserve(1 << 20)
    a = held.take(3, torch.uint8)
    b = held.take(100, torch.float32)
    c = held.take(7, torch.float64)
    assert a is not None and b is not None and c is not None
    assert (a.dtype, b.dtype, c.dtype) == (torch.uint8, torch.float32, torch.float64)
    assert (a.numel(), b.numel(), c.numel()) == (3, 100, 7)
    assert all(t.data_ptr() % ALIGNMENT == 0 for t in (a, b, c))
    assert all(bool((t == 0).all()) for t in (a, b, c))
    a.fill_(1)
    b.fill_(2.0)
    c.fill_(3.0)
    assert bool((a == 1).all()) and bool((b == 2.0).all()) and bool((c == 3.0).all())
    assert b.data_ptr() >= a.data_ptr() + 3 and c.data_ptr() >= b.data_ptr() + 400
    assert held.used_bytes == c.data_ptr() + 56 - a.data_ptr()


def test_a_request_that_does_not_fit_gets_none_and_leaves_the_rest_for_smaller_ones() -> None:
    held = MemoryReserve(4096)
    assert held.take(1024, torch.float32) is not None  # all 4096 bytes
    assert held.take(1, torch.uint8) is None
    held = MemoryReserve(4096)
    assert held.take(4097, torch.uint8) is None
    assert held.take(0, torch.uint8) is None
    assert held.used_bytes == 0
    assert held.take(4096, torch.uint8) is not None


def test_a_reserve_needs_a_positive_size() -> None:
    with pytest.raises(ValueError, match="positive size, got 0"):
        MemoryReserve(0)


def test_the_reserve_is_faulted_in_before_it_is_used() -> None:
    """The point of it: writing what it hands out costs no page faults (a fresh buffer of
    64 MiB costs 16384, one per 4 KiB page)."""
    held = MemoryReserve(64 << 20)
    tensor = held.take(64 << 20, torch.uint8)
    assert tensor is not None
    before = _minor_faults()
    tensor.fill_(7)
    assert _minor_faults() - before < 100


def test_empty_takes_from_the_installed_reserve_and_falls_back_to_fresh_memory(no_reserve: None) -> None:
    fresh = reserve.empty(10, torch.float32)
    assert fresh.shape == (10,) and fresh.dtype == torch.float32 and reserve.installed() is None
    held = reserve.install(1 << 16)
    assert reserve.installed() is held
    inside = reserve.empty(1000, torch.float32)
    assert held.used_bytes == 4000
    start = held._bytes.data_ptr()
    assert start <= inside.data_ptr() < start + held.num_bytes
    outside = reserve.empty(1 << 16, torch.uint8)  # does not fit what is left
    assert not start <= outside.data_ptr() < start + held.num_bytes
    assert outside.numel() == 1 << 16 and held.used_bytes == 4000


def test_empty_hands_out_only_cpu_memory(no_reserve: None) -> None:
    held = reserve.install(1 << 16)
    tensor = reserve.empty(8, torch.float32, torch.device("meta"))
    assert tensor.device.type == "meta" and held.used_bytes == 0


def test_a_new_reserve_replaces_the_old_one(no_reserve: None) -> None:
    first = reserve.install(1 << 16)
    second = reserve.install(1 << 17)
    assert reserve.installed() is second and second is not first and second.num_bytes == 1 << 17
