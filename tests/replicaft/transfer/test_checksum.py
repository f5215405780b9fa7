"""The chunk checksum (replicaft/transfer/checksum.py): its definition and what it detects."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicaft.transfer.checksum import ALGORITHM, DIGEST_BYTES, ROW_BYTES, digest

MASK = 2**64 - 1


def reference_digest(data: bytes) -> bytes:
    """The module docstring's definition, in plain integers."""
    padded = data.ljust(-(-len(data) // ROW_BYTES) * ROW_BYTES, b"\0")
    rows = [
        sum(int.from_bytes(padded[i + j : i + j + 8], "little") for j in range(0, ROW_BYTES, 8)) & MASK
        for i in range(0, len(padded), ROW_BYTES)
    ]
    s1 = sum(rows) & MASK
    s2 = sum((k + 1) * r for k, r in enumerate(rows)) & MASK
    return struct.pack("<QQ", s1, s2)


def of(data: bytes | bytearray) -> bytes:
    return digest([memoryview(data)])


def sample(length: int, seed: int = 1) -> bytes:
    """Deterministic bytes with every bit position in use (so top-bit carries happen)."""
    return bytes((i * 2654435761 + seed) >> 7 & 0xFF for i in range(length))


def test_algorithm_is_named_and_digest_is_16_bytes() -> None:
    assert ALGORITHM == "rowsum64-512"
    assert DIGEST_BYTES == 16 and len(of(b"x")) == DIGEST_BYTES


@pytest.mark.parametrize("length", [0, 1, 7, 8, 9, 511, 512, 513, 4096, 10_000])
def test_digest_matches_the_documented_definition(length: int) -> None:
    data = sample(length)
    assert of(data) == reference_digest(data)


def test_sums_wrap_modulo_2_to_the_64() -> None:
    data = b"\xff" * (ROW_BYTES * 3)
    assert of(data) == reference_digest(data)


@settings(deadline=None, max_examples=200)
@given(st.binary(max_size=3000), st.lists(st.integers(0, 3000), max_size=6))
def test_digest_of_pieces_equals_digest_of_their_concatenation(data: bytes, cuts: list[int]) -> None:
    bounds = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    view = memoryview(data)
    pieces = [view[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    assert digest(pieces) == of(data)


def test_digest_reads_pieces_at_unaligned_addresses() -> None:
    data = sample(5000)
    shifted = memoryview(b"\0" + data)[1:]
    assert digest([shifted[:1233], shifted[1233:]]) == of(data)


@settings(deadline=None, max_examples=300)
@given(st.integers(1, 5000), st.data())
def test_any_single_flipped_bit_is_detected(length: int, data: st.DataObject) -> None:
    original = sample(length)
    position = data.draw(st.integers(0, length - 1))
    bit = data.draw(st.integers(0, 7))
    corrupted = bytearray(original)
    corrupted[position] ^= 1 << bit
    assert of(corrupted) != of(original)


@settings(deadline=None, max_examples=300)
@given(st.integers(8, 5000), st.data())
def test_any_change_within_8_consecutive_bytes_is_detected(length: int, data: st.DataObject) -> None:
    original = sample(length)
    start = data.draw(st.integers(0, length - 8))
    replacement = data.draw(st.binary(min_size=8, max_size=8).filter(lambda b: b != original[start : start + 8]))
    corrupted = bytearray(original)
    corrupted[start : start + 8] = replacement
    assert of(corrupted) != of(original)


def test_two_rows_swapped_are_detected() -> None:
    original = sample(ROW_BYTES * 8)
    corrupted = bytearray(original)
    corrupted[ROW_BYTES * 2 : ROW_BYTES * 3], corrupted[ROW_BYTES * 5 : ROW_BYTES * 6] = (
        original[ROW_BYTES * 5 : ROW_BYTES * 6],
        original[ROW_BYTES * 2 : ROW_BYTES * 3],
    )
    assert of(corrupted) != of(original)


def test_data_shifted_by_one_alignment_step_is_detected() -> None:
    original = sample(ROW_BYTES * 8)
    assert of(original[64:] + original[:64]) != of(original)


def test_two_words_swapped_inside_one_row_are_not_detected_as_documented() -> None:
    original = sample(ROW_BYTES)
    corrupted = bytearray(original)
    corrupted[0:8], corrupted[8:16] = original[8:16], original[0:8]
    assert corrupted != original
    assert of(corrupted) == of(original)
