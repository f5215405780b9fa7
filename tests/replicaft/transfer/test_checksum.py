"""The chunk checksum (replicaft/transfer/checksum.py) and the receive that feeds it
(stripes.recv_hashed_into): its definition, what it detects, and that it is fed every byte."""

from __future__ import annotations

import socket
import threading

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from replicaft.transfer.checksum import ALGORITHM, DIGEST_BYTES, RECV_PIECE_BYTES, ChunkHash, digest
from replicaft.transfer.stripes import recv_hashed_into


def of(data: bytes | bytearray) -> bytes:
    return digest([memoryview(data)])


def sample(length: int, seed: int = 1) -> bytes:
    """Deterministic bytes with every bit position in use."""
    return bytes((i * 2654435761 + seed) >> 7 & 0xFF for i in range(length))


def test_algorithm_is_named_and_digest_is_16_bytes() -> None:
    assert ALGORITHM == "xxh3-128"
    assert DIGEST_BYTES == 16 and len(of(b"x")) == DIGEST_BYTES


@pytest.mark.parametrize("length", [0, 1, 7, 8, 9, 511, 512, 513, 4096, 10_000])
def test_digest_is_the_xxh3_128_of_the_chunk(length: int) -> None:
    data = sample(length)
    assert of(data) == xxhash.xxh3_128_digest(data)


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


def test_misplaced_data_is_detected() -> None:
    original = sample(4096)
    rows_swapped = bytearray(original)
    rows_swapped[1024:1536], rows_swapped[2560:3072] = original[2560:3072], original[1024:1536]
    assert of(rows_swapped) != of(original)
    assert of(original[64:] + original[:64]) != of(original)  # shifted by one alignment step


def test_changes_the_row_sums_missed_are_detected() -> None:
    """Two words of one 512-byte row swapped, and +x / -x in two words of a row: the
    ``rowsum64-512`` digest before XXH3 (manifest version 2) let both through."""
    original = sample(512)
    swapped = bytearray(original)
    swapped[0:8], swapped[8:16] = original[8:16], original[0:8]
    assert swapped != original and of(swapped) != of(original)
    cancelling = bytearray(original)
    a, b = int.from_bytes(original[0:8], "little"), int.from_bytes(original[16:24], "little")
    cancelling[0:8] = ((a + 1) % 2**64).to_bytes(8, "little")
    cancelling[16:24] = ((b - 1) % 2**64).to_bytes(8, "little")
    assert of(cancelling) != of(original)


def send_in_thread(sock: socket.socket, data: bytes, close: bool) -> threading.Thread:
    def send() -> None:
        sock.sendall(data)
        if close:
            sock.close()

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_recv_hashed_into_fills_the_view_and_feeds_the_digest_every_byte() -> None:
    data = sample(3 * RECV_PIECE_BYTES + 12_345)
    receiver, sender = socket.socketpair()
    with receiver, sender:
        receiver.settimeout(10.0)
        thread = send_in_thread(sender, data, close=False)
        out = bytearray(len(data))
        running = ChunkHash()
        view = memoryview(out)
        recv_hashed_into(receiver, view[:1000], running)  # a chunk's first piece (one tensor) ...
        recv_hashed_into(receiver, view[1000:], running)  # ... and the rest, in pieces
        thread.join(10.0)
    assert bytes(out) == data
    assert running.digest() == of(data)


def test_recv_hashed_into_raises_when_the_peer_closes_mid_piece() -> None:
    receiver, sender = socket.socketpair()
    with receiver:
        receiver.settimeout(10.0)
        send_in_thread(sender, b"x" * 100, close=True).join(10.0)
        with pytest.raises(ConnectionError, match="peer closed the connection mid-transfer"):
            recv_hashed_into(receiver, memoryview(bytearray(200)), ChunkHash())
