"""The heal transfer over real sockets (replicaft/transfer/): snapshot, state server, fetch_state.

State servers run in this process (they are plain TCP servers on threads); the "donor killed
mid-transfer" case runs the donor as a real process (tests/support/transfer_donor.py) and SIGKILLs it
while a healer is part-way through receiving a range from it.
"""

from __future__ import annotations

import dataclasses
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from typing import Any

import msgpack
import pytest
import torch
from conftest import REPO_ROOT, spawn_python
from support.transfer_donor import build_snapshot

from lighthouse.errors import ProtocolError
from replicaft.errors import HealError, StateError
from replicaft.state.flat import flatten, unflatten
from replicaft.transfer import live as live_module
from replicaft.transfer.client import HealResult, fetch_state
from replicaft.transfer.donors import Donor, streams_by_donor
from replicaft.transfer.live import LiveSnapshot
from replicaft.transfer.manifest import MAX_MANIFEST_BYTES, Manifest, TensorSpec, chunk_stripes
from replicaft.transfer.placement import Placement
from replicaft.transfer.progress import FetchProgress
from replicaft.transfer.requests import fetch_manifest
from replicaft.transfer.server import NotServed, RangeHook, Served, StateServer
from replicaft.transfer.snapshot import Snapshot, tensors_from_buffer
from replicaft.transfer.spare import SpareBuffer
from replicaft.transfer.wire import MAX_FRAME_BYTES, WIRE_VERSION, recv_frame, send_frame

STEP = 5
CHUNK = 64 * 1024
TOKEN = "s3cret-token"
DEADLINE_S = 20.0


def sample_state(num_floats: int = 300_000, seed: int = 0) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(num_floats, generator=generator), "b": torch.randn(7, generator=generator)},
        "optimizer": {
            "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(1000, generator=generator)}},
            "param_groups": [{"betas": (0.9, 0.95), "lr": 1e-3, "params": [0]}],
        },
        "buffers": {"count": torch.tensor(17, dtype=torch.int64), "mask": torch.rand(333, generator=generator) > 0.5},
        "step": STEP,
        "cursor": 4096,
    }


def sample_snapshot(seed: int = 0, step: int = STEP, replica_id: str = "donor") -> Snapshot:
    return Snapshot.capture(
        flatten(sample_state(seed=seed)), step=step, quorum_id=1, replica_id=replica_id, chunk_bytes=CHUNK
    )


@contextmanager
def serving(
    snapshot: Served | None, *, token: str | None = None, fault_hook: RangeHook | None = None, host: str = "127.0.0.1"
) -> Iterator[tuple[StateServer, str]]:
    """A StateServer on ``host`` publishing ``snapshot``, and its address; stopped on exit."""
    server = StateServer(host, token, fault_hook=fault_hook)
    address = server.start()
    if snapshot is not None:
        server.publish(snapshot)
    try:
        yield server, address
    finally:
        server.stop()


@contextmanager
def donors(
    *specs: tuple[str, Snapshot | None, RangeHook | None], token: str | None = None, one_host: bool = False
) -> Iterator[list[Donor]]:
    """One in-process StateServer per (replica_id, snapshot, fault_hook), each on its own
    loopback address (127.0.0.1, .2, ...) as donors on separate hosts are, so that every one
    is read (client.streams_by_donor); with ``one_host``, all on 127.0.0.1."""
    with ExitStack() as stack:
        yield [
            Donor(
                rid,
                stack.enter_context(
                    serving(snap, token=token, fault_hook=hook, host="127.0.0.1" if one_host else f"127.0.0.{i + 1}")
                )[1],
            )
            for i, (rid, snap, hook) in enumerate(specs)
        ]


def flip_one_byte(start: int, stop: int, data: memoryview) -> memoryview:
    altered = bytearray(data)
    altered[len(altered) // 2] ^= 0x10
    return memoryview(altered)


def connection_counter(expected: int) -> tuple[dict[int, str], Callable[..., RangeHook]]:
    """A fault hook per donor that records which connections (server threads) asked it for
    ranges, and holds each first request until ``expected`` connections have asked, then
    answers through ``then`` if given. For one fetch: a connection that finished its own
    stripes would otherwise take over another donor's before that donor was asked for any
    (client.py), and a test needing every donor to serve (or to fail) would not see it."""
    all_open = threading.Barrier(expected, timeout=DEADLINE_S)
    seen: dict[int, str] = {}

    def hook_of(donor: str, then: RangeHook | None = None) -> RangeHook:
        def hold_until_every_connection_asked(start: int, stop: int, data: memoryview) -> memoryview:
            if threading.get_ident() not in seen:
                seen[threading.get_ident()] = donor
                all_open.wait()
            return data if then is None else then(start, stop, data)

        return hold_until_every_connection_asked

    return seen, hook_of


def assert_same_state(result: HealResult, snapshot: Snapshot) -> None:
    """The healed tensors are bitwise the donor's (dtype, shape and bytes)."""
    expected = tensors_from_buffer(snapshot.buffer, snapshot.manifest)
    assert len(result.tensors) == len(expected)
    for got, want in zip(result.tensors, expected, strict=True):
        assert (
            got.dtype == want.dtype
            and got.shape == want.shape
            and torch.equal(got.view(-1).view(torch.uint8), want.view(-1).view(torch.uint8))
        )


# -- snapshot -------------------------------------------------------------------------------


def test_snapshot_of_every_dtype_reads_back_bitwise() -> None:
    state = {
        "f64": torch.randn(3, 2, dtype=torch.float64),
        "f16": torch.randn(5, dtype=torch.float16),
        "bf16": torch.randn(5, dtype=torch.bfloat16),
        "i8": torch.tensor([-1, 2, 3], dtype=torch.int8),
        "u8": torch.tensor([255, 0], dtype=torch.uint8),
        "b": torch.tensor([True, False, True]),
        "c128": torch.tensor([1 + 1j, 2 - 3j], dtype=torch.complex128),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 4),
        "strided": torch.arange(20.0).reshape(4, 5).t(),
    }
    flat = flatten(state)
    snapshot = Snapshot.capture(flat, step=2, quorum_id=9, replica_id="g0", chunk_bytes=256)
    assert snapshot.manifest.total_bytes == snapshot.buffer.numel()
    assert all(spec.offset % 64 == 0 for spec in snapshot.manifest.tensors)
    restored = unflatten(flat.skeleton, tensors_from_buffer(snapshot.buffer.clone(), snapshot.manifest))
    for name, tensor in state.items():
        assert restored[name].dtype == tensor.dtype and restored[name].shape == tensor.shape, name
        assert torch.equal(restored[name], tensor), name


def test_snapshot_is_a_copy_unaffected_by_later_training() -> None:
    state = {"w": torch.zeros(1000)}
    snapshot = Snapshot.capture(flatten(state), step=1, quorum_id=1, replica_id="g0", chunk_bytes=CHUNK)
    state["w"].add_(1.0)
    assert torch.equal(tensors_from_buffer(snapshot.buffer, snapshot.manifest)[0], torch.zeros(1000))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param(
            TensorSpec("state.w", "float128", (2,), 0, 32), "state.w has unknown dtype 'float128'", id="unknown_dtype"
        ),
        pytest.param(
            TensorSpec("state.w", "float32", (3,), 0, 8),
            "state.w: 8 bytes at offset 0 cannot hold float32 of shape [3]",
            id="too_few_bytes",
        ),
        pytest.param(TensorSpec("state.w", "float32", (2,), 2, 8), "state.w: 8 bytes at offset 2", id="misaligned"),
    ],
)
def test_tensors_from_buffer_rejects_inconsistent_spec_naming_the_tensor(spec: TensorSpec, message: str) -> None:
    manifest = Manifest(1, 1, "g0", None, (spec,), 64, 64, (0,))
    with pytest.raises(StateError) as raised:
        tensors_from_buffer(torch.zeros(64, dtype=torch.uint8), manifest)
    assert message in str(raised.value)


# -- fetch_state ----------------------------------------------------------------------------


def test_two_donor_striped_fetch_is_bitwise_equal_and_uses_both_donors() -> None:
    snapshot = sample_snapshot()
    _, hook_of = connection_counter(2)  # neither donor's connection can take the heal over alone
    with donors(("a", snapshot, hook_of("a")), ("b", sample_snapshot(replica_id="b"), hook_of("b"))) as ds:
        result = fetch_state(ds, STEP, token=None, timeout_s=DEADLINE_S)
    assert_same_state(result, snapshot)
    assert result.manifest.same_state_as(snapshot.manifest)
    assert set(result.bytes_by_donor) == {"a", "b"}
    assert all(n > 0 for n in result.bytes_by_donor.values())
    assert sum(result.bytes_by_donor.values()) == snapshot.manifest.total_bytes
    assert result.refetched_stripes == 0
    restored = unflatten(result.manifest.skeleton, result.tensors)
    assert torch.equal(restored["model"]["w"], sample_state()["model"]["w"])
    assert restored["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.95)


def test_fetch_with_matching_token_succeeds_for_any_healer_index() -> None:
    snapshot = sample_snapshot()
    for healer_index in range(3):
        _, hook_of = connection_counter(3)
        with donors(*((rid, snapshot, hook_of(rid)) for rid in "abc"), token=TOKEN) as ds:
            result = fetch_state(ds, STEP, token=TOKEN, timeout_s=DEADLINE_S, healer_index=healer_index)
        assert_same_state(result, snapshot)
        assert set(result.bytes_by_donor) == {"a", "b", "c"}


@pytest.mark.parametrize("token", [None, "wrong"])
def test_fetch_with_missing_or_wrong_token_fails_with_heal_error(token: str | None) -> None:
    with donors(("a", sample_snapshot(), None), token=TOKEN) as ds:
        with pytest.raises(HealError, match=r"no donor of \['a'\] served the manifest of step 5"):
            fetch_state(ds, STEP, token=token, timeout_s=DEADLINE_S)


def test_byte_flipped_by_one_donor_is_detected_and_refetched_from_the_other() -> None:
    snapshot = sample_snapshot()
    _, hook_of = connection_counter(2)
    progress = FetchProgress()
    with donors(("good", snapshot, hook_of("good")), ("flipper", snapshot, hook_of("flipper", flip_one_byte))) as ds:
        result = fetch_state(ds, STEP, token=None, timeout_s=DEADLINE_S, progress=progress)
    assert_same_state(result, snapshot)
    assert result.refetched_stripes > 0
    assert result.bytes_by_donor == {"good": snapshot.manifest.total_bytes}
    # The flipper's chunks verified before its bad one are taken back: the refetch counts them.
    assert progress.received_bytes == snapshot.manifest.total_bytes and progress.eta_s() == 0.0


def test_fetch_into_own_tensors_receives_in_place_and_new_memory_for_the_rest() -> None:
    """A healer's existing tensors of the right name, dtype and shape receive their bytes in
    place (no new memory, nothing to copy when applied); the rest land in new memory."""
    snapshot = sample_snapshot()
    mine = flatten(sample_state(seed=1))  # same structure, other values
    into = dict(zip(mine.names, mine.tensors, strict=True))
    into["state.buffers.mask"] = torch.zeros(334, dtype=torch.bool)  # another shape: not in place
    _, hook_of = connection_counter(2)
    with donors(
        ("a", snapshot, hook_of("a")), ("b", sample_snapshot(replica_id="b"), hook_of("b", flip_one_byte))
    ) as ds:
        result = fetch_state(ds, STEP, token=None, timeout_s=DEADLINE_S, into=into)
    assert_same_state(result, snapshot)
    assert result.refetched_stripes > 0  # b's bad stripes were refetched from a, in place too
    assert "state.buffers.mask" not in result.in_place and "state.model.w" in result.in_place
    for name, tensor in zip(result.manifest.tensors, result.tensors, strict=True):
        assert (tensor is into[name.name]) == (name.name in result.in_place)
    assert torch.equal(into["state.model.w"], sample_state()["model"]["w"])


def test_placement_splits_a_range_at_tensor_boundaries_padding_included() -> None:
    snapshot = sample_snapshot()
    flat = flatten(sample_state(seed=1))
    placement = Placement(snapshot.manifest, {"state.model.b": flat.tensors[flat.names.index("state.model.b")]})
    b = next(t for t in snapshot.manifest.tensors if t.name == "state.model.b")
    pieces = placement.receive(b.offset - 10, b.offset + b.num_bytes + 10, time.monotonic() + DEADLINE_S).pieces
    assert [len(p) for p in pieces] == [10, b.num_bytes, 10]
    whole = placement.receive(0, snapshot.manifest.total_bytes, time.monotonic() + DEADLINE_S).pieces
    assert sum(len(p) for p in whole) == snapshot.manifest.total_bytes
    assert placement.scratch.numel() == snapshot.manifest.total_bytes - b.num_bytes


def test_byte_flipped_by_the_only_donor_fails_with_heal_error() -> None:
    with donors(("flipper", sample_snapshot(), flip_one_byte)) as ds:
        with pytest.raises(HealError) as raised:
            fetch_state(ds, STEP, token=None, timeout_s=DEADLINE_S)
    message = str(raised.value)
    assert "heal of step 5 failed" in message and "failed on every donor" in message
    assert "fails its checksum" in message


def flip_in_the_first_chunk(start: int, stop: int, data: memoryview) -> memoryview:
    altered = bytearray(data)
    altered[CHUNK // 3] ^= 0x01
    return memoryview(altered)


def test_flipped_byte_in_the_first_chunk_fails_the_stripe_though_later_chunks_are_good() -> None:
    """Each chunk is checked as it arrives: the bad first chunk fails the stripe (and so the
    heal, with one donor) by its own index, whatever follows it. One stream, so that the
    stripe that fails first is the one starting at chunk 0."""
    snapshot = sample_snapshot()
    assert snapshot.manifest.num_chunks > 3
    with donors(("flipper", snapshot, flip_in_the_first_chunk)) as ds:
        with pytest.raises(HealError, match=r"chunk 0 \(bytes 0\.\.65536\) from donor flipper fails its checksum"):
            fetch_state(ds, STEP, token=None, timeout_s=DEADLINE_S, connections=1)


def test_flipped_byte_in_an_early_chunk_received_in_place_is_refetched_and_overwritten() -> None:
    snapshot = sample_snapshot()
    mine = flatten(sample_state(seed=1))
    into = dict(zip(mine.names, mine.tensors, strict=True))
    _, hook_of = connection_counter(2)
    with donors(
        ("flipper", snapshot, hook_of("flipper", flip_in_the_first_chunk)),
        ("good", sample_snapshot(replica_id="good"), hook_of("good")),
    ) as ds:
        result = fetch_state(ds, STEP, token=None, timeout_s=DEADLINE_S, into=into)
    assert_same_state(result, snapshot)
    assert result.refetched_stripes >= 1
    assert result.bytes_by_donor == {"good": snapshot.manifest.total_bytes}


def test_manifest_naming_an_unknown_checksum_algorithm_is_refused_by_name() -> None:
    snapshot = sample_snapshot()
    older = Snapshot(snapshot.buffer, dataclasses.replace(snapshot.manifest, checksum="crc32"))
    with donors(("older", older, None)) as ds:
        with pytest.raises(
            ProtocolError, match="Manifest.checksum is 'crc32'; this side verifies chunks with 'xxh3-128'"
        ):
            fetch_manifest(ds[0], STEP, None, time.monotonic() + DEADLINE_S)
        with pytest.raises(HealError, match=r"no donor of \['older'\] served the manifest of step 5 \(.*'crc32'"):
            fetch_state(ds, STEP, token=None, timeout_s=DEADLINE_S)


def test_next_range_is_requested_before_the_current_one_is_read() -> None:
    """A donor that answers a range only once the next request is in still serves the heal:
    the healer never leaves the connection idle waiting for its own next request."""
    snapshot = sample_snapshot()
    data = memoryview(snapshot.buffer.numpy())
    requests_seen_first: list[int] = []

    def answer(conn: socket.socket, request: dict[str, Any]) -> None:
        if request["op"] == "manifest":
            body = snapshot.manifest.encode()
            send_frame(conn, {"ok": True, "num_bytes": len(body)})
            conn.sendall(body)
        else:
            send_frame(conn, {"ok": True, "num_bytes": request["stop"] - request["start"]})
            conn.sendall(data[request["start"] : request["stop"]])

    def serve(listener: socket.socket) -> None:
        for _ in range(2):  # the manifest connection, then the range connection
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(DEADLINE_S)
                waiting = [recv_frame(conn, "request")]
                if waiting[0]["op"] == "range":
                    waiting.append(recv_frame(conn, "request"))  # blocks unless it was sent ahead
                    requests_seen_first.append(len(waiting))
                while True:
                    for request in waiting:
                        answer(conn, request)
                    try:
                        waiting = [recv_frame(conn, "request")]
                    except ConnectionError:
                        break

    with socket.create_server(("127.0.0.1", 0)) as listener, ThreadPoolExecutor(1) as pool:
        served = pool.submit(serve, listener)
        result = fetch_state(
            [Donor("d", f"127.0.0.1:{listener.getsockname()[1]}")],
            STEP,
            token=None,
            timeout_s=DEADLINE_S,
            connections=1,
        )
        served.result(timeout=DEADLINE_S)
    assert_same_state(result, snapshot)
    assert requests_seen_first == [2]


def test_one_donor_is_pulled_over_several_connections_at_once() -> None:
    """Each connection has its own stripes in flight: the donor sees them all open before it
    answers any range."""
    snapshot = sample_snapshot()
    seen, hook_of = connection_counter(3)
    with donors(("d", snapshot, hook_of("d"))) as ds:
        result = fetch_state(ds, STEP, token=None, timeout_s=DEADLINE_S, connections=3)
    assert_same_state(result, snapshot)
    assert sorted(seen.values()) == ["d", "d", "d"]
    assert result.bytes_by_donor == {"d": snapshot.manifest.total_bytes}


def test_connections_are_dealt_across_donors_on_separate_hosts_at_least_one_each() -> None:
    snapshot = sample_snapshot()
    for connections, expected in ((3, ["a", "a", "b"]), (1, ["a", "b"])):
        seen, hook_of = connection_counter(len(expected))
        with donors(("a", snapshot, hook_of("a")), ("b", snapshot, hook_of("b"))) as ds:
            result = fetch_state(ds, STEP, token=None, timeout_s=DEADLINE_S, connections=connections)
        assert_same_state(result, snapshot)
        assert sorted(seen.values()) == expected


def test_streams_are_dealt_over_hosts_then_over_each_hosts_donors() -> None:
    def on(*addresses: str) -> list[Donor]:
        return [Donor(f"d{i}", address) for i, address in enumerate(addresses)]

    one_host = on("10.0.0.1:1", "10.0.0.1:2", "10.0.0.1:3")
    assert streams_by_donor(2, one_host) == {"d0": 2}
    assert streams_by_donor(2, one_host, healer_index=1) == {"d1": 2}
    assert streams_by_donor(4, one_host, healer_index=5) == {"d2": 4}
    assert streams_by_donor(2, on("10.0.0.1:1")) == {"d0": 2}
    assert streams_by_donor(2, on("10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1")) == {"d0": 1, "d1": 1, "d2": 1}
    assert streams_by_donor(4, on("10.0.0.1:1", "10.0.0.2:1")) == {"d0": 2, "d1": 2}
    assert streams_by_donor(5, on("10.0.0.1:1", "10.0.0.1:2", "10.0.0.2:1"), healer_index=1) == {"d1": 3, "d2": 2}
    assert streams_by_donor(2, on("[::1]:7", "[::1]:8", "[::2]:7")) == {"d0": 1, "d2": 1}


def test_of_donors_on_one_host_one_is_read_over_all_its_connections() -> None:
    """Three donors on 127.0.0.1, two connections: both go to one donor, which one turning with
    the healer's index; the others serve their manifests (they vote on the state) and nothing else."""
    snapshot = sample_snapshot()
    for healer_index, read in ((0, "a"), (1, "b"), (2, "c")):
        seen, hook_of = connection_counter(2)
        with donors(*((rid, snapshot, hook_of(rid)) for rid in "abc"), one_host=True) as ds:
            result = fetch_state(ds, STEP, token=None, timeout_s=DEADLINE_S, healer_index=healer_index, connections=2)
        assert_same_state(result, snapshot)
        assert result.bytes_by_donor == {read: snapshot.manifest.total_bytes}
        assert list(seen.values()) == [read, read]


def test_a_spare_donor_on_the_host_is_read_in_place_of_one_that_fails() -> None:
    """Two donors on one host: only ``a`` is read until it drops its connection at its first
    range; then ``b`` is, and the heal completes from it alone."""
    snapshot = sample_snapshot()
    asked: list[str] = []

    def fail(start: int, stop: int, data: memoryview) -> memoryview:
        asked.append("a")
        raise ConnectionResetError("the donor went away")

    def record(start: int, stop: int, data: memoryview) -> memoryview:
        asked.append("b")
        return data

    with donors(("a", snapshot, fail), ("b", snapshot, record), one_host=True) as ds:
        result = fetch_state(ds, STEP, token=None, timeout_s=DEADLINE_S, connections=1)
    assert_same_state(result, snapshot)
    assert asked[0] == "a" and set(asked[1:]) == {"b"}
    assert result.bytes_by_donor == {"b": snapshot.manifest.total_bytes} and result.refetched_stripes == 1


def test_a_connection_done_with_its_donor_takes_over_the_stripes_a_slow_donor_has_not_begun() -> None:
    """The slow donor answers its first range, then stalls until the fast donor has been
    asked for one of the slow donor's stripes; the heal completes with the fast donor having
    sent more than its share, and nothing was refetched (no donor failed)."""
    snapshot = sample_snapshot()
    slow_stripes = {
        (st.start, st.stop) for st in chunk_stripes(snapshot.manifest, ["fast", "slow"]) if st.donor == "slow"
    }
    taken_over = threading.Event()
    slow_ranges: list[tuple[int, int]] = []

    def fast(start: int, stop: int, data: memoryview) -> memoryview:
        if (start, stop) in slow_stripes:
            taken_over.set()
        return data

    def slow(start: int, stop: int, data: memoryview) -> memoryview:
        slow_ranges.append((start, stop))
        if len(slow_ranges) > 1:
            assert taken_over.wait(DEADLINE_S)
        return data

    with donors(("fast", snapshot, fast), ("slow", snapshot, slow)) as ds:
        result = fetch_state(ds, STEP, token=None, timeout_s=DEADLINE_S, connections=2)
    assert_same_state(result, snapshot)
    assert taken_over.is_set() and result.taken_over_stripes >= 1 and result.refetched_stripes == 0
    assert result.bytes_by_donor["fast"] > snapshot.manifest.total_bytes - sum(b - a for a, b in slow_stripes)


def test_connections_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="connections=0; it must be at least 1"):
        fetch_state([Donor("d", "127.0.0.1:1")], STEP, token=None, timeout_s=1.0, connections=0)


def test_donor_stopped_between_manifest_and_ranges_is_replaced_by_the_other() -> None:
    snapshot = sample_snapshot()
    servers: list[StateServer] = []

    def stop_and_drop_the_connection(start: int, stop: int, data: memoryview) -> memoryview:
        servers[0].stop()
        raise ConnectionResetError("the donor went away")

    _, hook_of = connection_counter(2)
    with (
        serving(snapshot, fault_hook=hook_of("alive")) as (_, alive),
        serving(snapshot, fault_hook=hook_of("dying", stop_and_drop_the_connection), host="127.0.0.2") as (
            dying,
            address,
        ),
    ):
        servers.append(dying)
        result = fetch_state([Donor("alive", alive), Donor("dying", address)], STEP, token=None, timeout_s=DEADLINE_S)
    assert_same_state(result, snapshot)
    assert result.refetched_stripes >= 1
    assert result.bytes_by_donor == {"alive": snapshot.manifest.total_bytes}


def test_stopped_server_refuses_new_connections() -> None:
    server = StateServer("127.0.0.1")
    host, port = server.start().rsplit(":", 1)
    server.publish(sample_snapshot())
    server.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=5).close()


def test_donor_killed_mid_transfer_healer_completes_from_the_other() -> None:
    num_bytes, step = 64 * 1024 * 1024, 11
    process = spawn_python(
        str(REPO_ROOT / "tests" / "support" / "transfer_donor.py"),
        "--num-bytes",
        str(num_bytes),
        "--step",
        str(step),
        "--stall-mid-send",
        "--host",
        "127.0.0.2",
        name="transfer-donor",
    )
    snapshot = build_snapshot(num_bytes, step, "in-process")
    _, serving_line = process.wait_for_json(lambda o: o.get("event") == "serving", 60.0, what="its address")
    remote_sending = threading.Event()

    def after_the_remote_began(start: int, stop: int, data: memoryview) -> memoryview:
        # Else the local donor's connection could take over every remote stripe first.
        remote_sending.wait(60.0)
        return data

    with donors(("in-process", snapshot, after_the_remote_began)) as (local,), ThreadPoolExecutor(1) as pool:
        remote = Donor("subprocess", serving_line["address"])
        started = time.monotonic()
        future = pool.submit(fetch_state, [local, remote], step, token=None, timeout_s=60.0)
        try:
            _, mid_send = process.wait_for_json(lambda o: o.get("event") == "mid_send", 60.0, what="a range half sent")
        finally:
            remote_sending.set()
        assert not future.done()
        process.kill()
        result = future.result(timeout=60.0)
    assert process.popen.returncode < 0
    assert_same_state(result, snapshot)
    assert result.refetched_stripes >= 1
    assert result.bytes_by_donor == {"in-process": snapshot.manifest.total_bytes}
    assert 0 < mid_send["sent"] < mid_send["stop"] - mid_send["start"]
    assert time.monotonic() - started < 60.0


def test_stalled_only_donor_fails_with_heal_error_within_the_timeout() -> None:
    release = threading.Event()

    def stall(start: int, stop: int, data: memoryview) -> memoryview:
        release.wait(30.0)
        return data

    try:
        with donors(("stalled", sample_snapshot(), stall)) as ds:
            started = time.monotonic()
            with pytest.raises(HealError, match="failed on every donor"):
                fetch_state(ds, STEP, token=None, timeout_s=1.0)
            assert time.monotonic() - started < 10.0
    finally:
        release.set()


def test_minority_donor_with_other_bytes_is_not_used() -> None:
    snapshot = sample_snapshot(seed=0)
    _, hook_of = connection_counter(2)
    with donors(
        ("a", snapshot, hook_of("a")), ("odd", sample_snapshot(seed=1), None), ("b", snapshot, hook_of("b"))
    ) as ds:
        result = fetch_state(ds, STEP, token=None, timeout_s=DEADLINE_S)
    assert_same_state(result, snapshot)
    assert set(result.bytes_by_donor) == {"a", "b"}


def test_donor_serving_another_step_is_skipped() -> None:
    snapshot = sample_snapshot()
    with donors(
        ("behind", sample_snapshot(step=STEP - 1), None), ("current", snapshot, None), ("empty", None, None)
    ) as ds:
        result = fetch_state(ds, STEP, token=None, timeout_s=DEADLINE_S)
    assert_same_state(result, snapshot)
    assert set(result.bytes_by_donor) == {"current"}


def ipv6_loopback_available() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6_loopback_available(), reason="no IPv6 loopback here")
def test_fetch_over_ipv6_loopback_uses_a_bracketed_address() -> None:
    snapshot = sample_snapshot()
    server = StateServer("::1")
    address = server.start()
    try:
        server.publish(snapshot)
        assert address.startswith("[::1]:")
        result = fetch_state([Donor("v6", address)], STEP, token=None, timeout_s=DEADLINE_S)
    finally:
        server.stop()
    assert_same_state(result, snapshot)


def test_no_donors_fails_with_heal_error() -> None:
    with pytest.raises(HealError, match="no donor to heal step 5 from"):
        fetch_state([], STEP, token=None, timeout_s=1.0)


def test_unreachable_donors_fail_with_heal_error() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{unused.getsockname()[1]}"
        with pytest.raises(HealError, match=r"no donor of \['x'\] served the manifest"):
            fetch_state([Donor("x", address)], STEP, token=None, timeout_s=2.0)


def test_empty_state_fetches_as_no_tensors() -> None:
    snapshot = Snapshot.capture(flatten({"step": 3}), step=STEP, quorum_id=1, replica_id="a", chunk_bytes=CHUNK)
    with donors(("a", snapshot, None)) as ds:
        result = fetch_state(ds, STEP, token=None, timeout_s=DEADLINE_S)
    assert result.tensors == [] and result.num_bytes == 0
    assert unflatten(result.manifest.skeleton, []) == {"step": 3}


# -- a hostile donor, seen by the client ----------------------------------------------------


@contextmanager
def scripted_donor(reply: Callable[[dict[str, Any]], tuple[dict[str, Any], bytes]]) -> Iterator[Donor]:
    """A fake donor on a real socket: answers each request with ``reply(request)``."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10.0)

    def serve() -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            try:
                frame, raw = reply(recv_frame(conn, "test request"))
                send_frame(conn, frame)
                conn.sendall(raw)
                conn.recv(1)
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield Donor("scripted", f"127.0.0.1:{listener.getsockname()[1]}")
    finally:
        listener.close()
        thread.join(10.0)


def test_client_refuses_an_oversized_manifest_before_allocating_it() -> None:
    with scripted_donor(lambda request: ({"ok": True, "num_bytes": MAX_MANIFEST_BYTES + 1}, b"")) as donor:
        with pytest.raises(ProtocolError, match=f"donor scripted announced a {MAX_MANIFEST_BYTES + 1}-byte manifest"):
            fetch_manifest(donor, STEP, None, time.monotonic() + 10.0)


def test_client_refuses_the_manifest_of_another_step() -> None:
    body = sample_snapshot(step=STEP + 1).manifest.encode()
    with scripted_donor(lambda request: ({"ok": True, "num_bytes": len(body)}, body)) as donor:
        with pytest.raises(ProtocolError, match="donor scripted sent the manifest of step 6; asked for 5"):
            fetch_manifest(donor, STEP, None, time.monotonic() + 10.0)


def test_client_reports_the_donors_error_frame() -> None:
    with scripted_donor(lambda request: ({"ok": False, "error": "busy"}, b"")) as donor:
        with pytest.raises(ProtocolError, match="manifest from scripted refused: busy"):
            fetch_manifest(donor, STEP, None, time.monotonic() + 10.0)


# -- hostile input to the state server ------------------------------------------------------


def frame(body: Any) -> bytes:
    data = msgpack.packb(body, use_bin_type=True)
    return struct.pack(">I", len(data)) + data


def request(**fields: Any) -> bytes:
    return frame({"v": WIRE_VERSION, "token": TOKEN, "op": "range", "step": STEP, "start": 0, "stop": 64, **fields})


def without(field: str) -> bytes:
    body = {"v": WIRE_VERSION, "token": TOKEN, "op": "range", "step": STEP, "start": 0, "stop": 64}
    del body[field]
    return frame(body)


@pytest.fixture(scope="module")
def guarded_server() -> Iterator[tuple[str, int, Snapshot]]:
    snapshot = sample_snapshot()
    with serving(snapshot, token=TOKEN) as (_, address):
        host, port = address.rsplit(":", 1)
        yield host, int(port), snapshot


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param(
            struct.pack(">I", MAX_FRAME_BYTES + 1),
            f"state request frame is {MAX_FRAME_BYTES + 1} bytes; the limit is {MAX_FRAME_BYTES}",
            id="oversized_frame_header",
        ),
        pytest.param(
            struct.pack(">I", 2**32 - 1) + b"x" * 1000,
            "state request frame is 4294967295 bytes",
            id="oversized_with_body",
        ),
        pytest.param(
            b"\x00\x00\x00\x04\xc1\xc1\xc1\xc1", "state request frame is not valid msgpack", id="garbage_bytes"
        ),
        pytest.param(frame([1, 2, 3]), "state request frame must be a msgpack map, got list", id="not_a_map"),
        pytest.param(frame({1: 2}), "state request frame is not valid msgpack", id="int_keys"),
        pytest.param(
            request(v=1),
            "StateRequest speaks version 1; this server speaks 3. Run the same replicaft version on donors and healers",
            id="older_version",
        ),
        pytest.param(request(v=4), "StateRequest speaks version 4; this server speaks 3", id="newer_version"),
        pytest.param(without("v"), "StateRequest speaks version None", id="missing_version"),
        pytest.param(request(token="guess"), "StateRequest: wrong token", id="wrong_token"),
        pytest.param(request(token=TOKEN + "x"), "StateRequest: wrong token", id="token_with_suffix"),
        pytest.param(request(token=12345), "StateRequest: wrong token", id="token_not_a_string"),
        pytest.param(request(token=None), "StateRequest: missing token", id="null_token"),
        pytest.param(without("token"), "StateRequest: missing token", id="missing_token"),
        pytest.param(
            request(op="delete"), "StateRequest.op is 'delete'; expected 'manifest', 'range' or 'done'", id="unknown_op"
        ),
        pytest.param(request(op="done"), "StateRequest.reader is missing", id="done_without_reader"),
        pytest.param(request(op="done", reader=7), "StateRequest.reader is int", id="done_reader_not_a_string"),
        pytest.param(without("op"), "StateRequest.op is missing", id="missing_op"),
        pytest.param(request(op=["range"]), "StateRequest.op is list", id="op_not_a_string"),
        pytest.param(request(step=4), "StateRequest: step 4 is not served here (serving: [5])", id="wrong_step"),
        pytest.param(request(step="5"), "StateRequest.step is str '5'; expected an integer", id="step_not_an_int"),
        pytest.param(request(step=-1), "StateRequest.step is -1", id="negative_step"),
        pytest.param(
            request(start=128, stop=64), "StateRequest.stop is 64; expected 128 <= stop <=", id="start_after_stop"
        ),
        pytest.param(
            request(stop=2**40), "StateRequest.stop is 1099511627776; expected 0 <= stop <=", id="stop_past_total"
        ),
        pytest.param(request(start=-64), "StateRequest.start is -64", id="negative_start"),
        pytest.param(request(start=1.5), "StateRequest.start is float", id="float_start"),
        pytest.param(without("stop"), "StateRequest.stop is missing", id="missing_stop"),
    ],
)
def test_hostile_request_gets_an_error_frame_and_the_server_keeps_serving(
    guarded_server: tuple[str, int, Snapshot], raw: bytes, message: str
) -> None:
    host, port, snapshot = guarded_server
    with socket.create_connection((host, port), timeout=10.0) as sock:
        sock.sendall(raw)
        reply = recv_frame(sock, "reply")
        assert reply["ok"] is False
        assert message in reply["error"]
        assert connection_closed(sock)
    assert_server_still_serves(host, port, snapshot)


def test_client_hanging_up_mid_frame_does_not_disturb_the_server(guarded_server: tuple[str, int, Snapshot]) -> None:
    host, port, snapshot = guarded_server
    for partial in (b"\x00", b"\x00\x00\x00\x20", request()[:10]):
        with socket.create_connection((host, port), timeout=10.0) as sock:
            sock.sendall(partial)
    assert_server_still_serves(host, port, snapshot)


def test_one_connection_serves_many_requests(guarded_server: tuple[str, int, Snapshot]) -> None:
    host, port, snapshot = guarded_server
    with socket.create_connection((host, port), timeout=10.0) as sock:
        for start, stop in (
            (0, 64),
            (64, 64),
            (100, 1000),
            (snapshot.manifest.total_bytes - 3, snapshot.manifest.total_bytes),
        ):
            sock.sendall(request(start=start, stop=stop))
            assert recv_frame(sock, "reply") == {"ok": True, "num_bytes": stop - start}
            assert recv_all(sock, stop - start) == bytes(snapshot.buffer[start:stop].numpy())


def test_unpublished_server_says_it_serves_no_step() -> None:
    with serving(None) as (_, address):
        host, port = address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10.0) as sock:
            sock.sendall(frame({"v": WIRE_VERSION, "op": "manifest", "step": STEP}))
            reply = recv_frame(sock, "reply")
    assert reply == {
        "ok": False,
        "error": "StateRequest: step 5 is not served here (serving: None)",
        "code": "not_served",
    }


def recv_all(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        piece = sock.recv(n - len(out))
        assert piece, "connection closed early"
        out += piece
    return bytes(out)


def connection_closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def assert_server_still_serves(host: str, port: int, snapshot: Snapshot) -> None:
    manifest = fetch_manifest(Donor("guarded", f"{host}:{port}"), STEP, TOKEN, time.monotonic() + 10.0)
    assert manifest == snapshot.manifest


def test_two_captures_of_the_same_state_have_identical_bytes_padding_included() -> None:
    # Regression: alignment padding was left uninitialised, so donors holding the same state
    # could publish different checksums and be dropped as disagreeing.
    first = sample_snapshot()
    garbage = torch.full((first.manifest.total_bytes,), 0xAB, dtype=torch.uint8)
    second = Snapshot.capture(
        flatten(sample_state()), step=STEP, quorum_id=1, replica_id="other", chunk_bytes=CHUNK, out=garbage
    )
    assert torch.equal(first.buffer, second.buffer)
    assert first.manifest.checksums == second.manifest.checksums


# -- a donor's live snapshot (live.py) --------------------------------------------------------


def big_state(seed: int = 0) -> dict[str, Any]:
    """Large tensors served live across several chunks, small ones copied at once."""
    generator = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(700_000, generator=generator), "b": torch.randn(5, generator=generator)},
        "optimizer": {"exp_avg": torch.randn(400_003, generator=generator)},
        "step": STEP,
    }


def live_snapshot(state: dict[str, Any], readers: frozenset[str] = frozenset({"h"})) -> LiveSnapshot:
    return LiveSnapshot(flatten(state), step=STEP, quorum_id=1, replica_id="donor", readers=readers, chunk_bytes=CHUNK)


def copy_of(state: dict[str, Any]) -> Snapshot:
    return Snapshot.capture(flatten(state), step=STEP, quorum_id=1, replica_id="donor", chunk_bytes=CHUNK)


def fetch_as(reader: str, address: str) -> HealResult:
    return fetch_state([Donor("donor", address)], STEP, token=None, timeout_s=DEADLINE_S, reader=reader)


def test_live_snapshot_has_the_manifest_of_a_copy_and_serves_its_bytes() -> None:
    state = big_state()
    live, copy = live_snapshot(state), copy_of(state)
    assert live.manifest == copy.manifest and live.manifest.num_chunks > 3
    with serving(live) as (_, address):
        assert_same_state(fetch_as("h", address), copy)


def test_seal_keeps_nothing_once_every_expected_healer_was_sent_everything_and_refuses_it_after() -> None:
    state = big_state()
    live = live_snapshot(state)
    with serving(live) as (_, address):
        fetch_as("h", address)
        assert live.seal(wait_s=0.0) == "" and live.kept_bytes == 0
        state["model"]["w"].add_(1.0)  # the donor's optimizer step
        with pytest.raises(HealError, match="not kept"):
            fetch_as("h", address)


def test_two_live_donors_seal_without_waiting_or_keeping_once_the_healer_has_the_whole_state() -> None:
    """Each donor sent only its stripes; the healer's done notice tells both it has the rest,
    so neither waits out its seal nor keeps a copy. seal waits (up to its bound) for the
    notice, which the healer sends once the fetch has returned."""
    state = big_state()
    a, b = live_snapshot(state), live_snapshot(state)
    _, hook_of = connection_counter(2)  # each donor sends some of the stripes
    with (
        serving(a, fault_hook=hook_of("a")) as (_, address_a),
        serving(b, fault_hook=hook_of("b"), host="127.0.0.2") as (_, address_b),
    ):
        result = fetch_state(
            [Donor("a", address_a), Donor("b", address_b)], STEP, token=None, timeout_s=DEADLINE_S, reader="h"
        )
        assert all(n < result.num_bytes for n in result.bytes_by_donor.values())
        for donor in (a, b):
            assert donor.seal(wait_s=DEADLINE_S) == ""
            assert donor.kept_bytes == 0 and donor.waited_s < DEADLINE_S


def test_a_spare_live_donor_is_told_at_once_and_seals_without_waiting_or_keeping() -> None:
    """Two live donors on one host: ``a`` is read, ``b`` is a spare. While ``a`` is still
    held at its first range, ``b`` seals: the healer has already told it that it has what it
    needs from it, so ``b`` neither waits out its bound nor keeps a copy."""
    state = big_state()
    a, b = live_snapshot(state), live_snapshot(state)
    sending, spare_sealed = threading.Event(), threading.Event()

    def hold_until_the_spare_sealed(start: int, stop: int, data: memoryview) -> memoryview:
        sending.set()
        assert spare_sealed.wait(DEADLINE_S)
        return data

    with (
        serving(a, fault_hook=hold_until_the_spare_sealed) as (_, address_a),
        serving(b) as (_, address_b),
        ThreadPoolExecutor(1) as pool,
    ):
        future = pool.submit(
            fetch_state,
            [Donor("a", address_a), Donor("b", address_b)],
            STEP,
            token=None,
            timeout_s=DEADLINE_S,
            reader="h",
        )
        try:
            assert sending.wait(DEADLINE_S)
            assert b.seal(wait_s=DEADLINE_S) == ""
        finally:
            spare_sealed.set()
        result = future.result(timeout=DEADLINE_S)
    assert b.kept_bytes == 0 and b.waited_s < DEADLINE_S / 2
    assert result.bytes_by_donor == {"a": result.num_bytes}


def test_seal_keeps_what_an_expected_healer_was_not_sent_and_serves_it_after_the_state_moves_on() -> None:
    state = big_state()
    copy = copy_of(state)
    live = live_snapshot(state, readers=frozenset({"h1", "h2"}))
    with serving(live) as (_, address):
        assert_same_state(fetch_as("h1", address), copy)
        assert live.seal(wait_s=0.0) == ""
        assert live.kept_bytes == copy.manifest.total_bytes  # h2 was sent nothing
        for t in (state["model"]["w"], state["optimizer"]["exp_avg"]):
            t.mul_(-3.0)
        assert_same_state(fetch_as("h2", address), copy)


def test_seal_waits_for_a_transfer_under_way_instead_of_copying() -> None:
    state = big_state()
    copy = copy_of(state)
    live = live_snapshot(state)
    with serving(live) as (_, address), ThreadPoolExecutor(1) as pool:
        healed = pool.submit(fetch_as, "h", address)
        assert live.seal(wait_s=DEADLINE_S) == ""
        assert live.kept_bytes == 0 and live.waited_s < DEADLINE_S
        assert_same_state(healed.result(), copy)


def test_seal_names_a_served_tensor_written_in_place_meanwhile() -> None:
    state = big_state()
    live = live_snapshot(state)
    state["optimizer"]["exp_avg"].mul_(0.5)  # user code stepping during forward
    why = live.seal(wait_s=0.0)
    assert "changed while it was served" in why and "state.optimizer.exp_avg" in why


def test_seal_shuts_a_stalled_healers_connection_instead_of_waiting_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live_module, "LIVE_SEND_GRACE_S", 0.2)
    state = {"w": torch.zeros(16 << 20)}  # 64 MiB in 16 MiB chunks: one chunk is more than loopback buffers hold
    live = LiveSnapshot(
        flatten(state), step=STEP, quorum_id=1, replica_id="donor", readers=frozenset({"h"}), chunk_bytes=16 << 20
    )
    with serving(live) as (_, address):
        host, port = address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as stalled:
            stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            send_frame(
                stalled,
                {
                    "v": WIRE_VERSION,
                    "op": "range",
                    "step": STEP,
                    "start": 0,
                    "stop": live.manifest.total_bytes,
                    "reader": "h",
                },
            )
            assert recv_frame(stalled, "reply")["ok"]
            stalled.recv(1)  # the donor is sending; this healer reads no more
            started = time.monotonic()
            assert live.seal(wait_s=0.0) == ""
            assert time.monotonic() - started < 5.0
            assert live.shut == 1 and 0 < live.kept_bytes <= live.manifest.total_bytes
            stalled.settimeout(DEADLINE_S)
            with pytest.raises((ConnectionError, OSError)):
                while stalled.recv(1 << 20):
                    pass
                raise ConnectionError("closed")


def test_a_fetch_under_way_when_the_donor_seals_completes_from_the_kept_copy() -> None:
    state = {"w": torch.randn(16 << 20, generator=torch.Generator().manual_seed(3))}  # 64 MiB, 1024 chunks
    copy = copy_of(state)
    live = live_snapshot(state)
    with serving(live) as (_, address), ThreadPoolExecutor(1) as pool:
        healed = pool.submit(fetch_as, "h", address)
        deadline = time.monotonic() + DEADLINE_S
        while not any("h" in sent for sent in live._sent_to) and time.monotonic() < deadline:
            time.sleep(0.001)  # polls for the first chunk sent, an observable event
        assert live.seal(wait_s=0.0) == ""
        state["w"].mul_(-1.0)  # the optimizer steps as soon as the seal returns
        assert_same_state(healed.result(), copy)


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {DEADLINE_S}s")
        time.sleep(0.001)


def test_kept_chunks_go_into_the_spare_buffer_which_returns_to_it_once_no_send_reads_it() -> None:
    """The host buffer a checkpoint's snapshot leaves behind is the one a donor keeps chunks
    in, and it goes back for the next checkpoint only when no healer is still being sent
    from it: a checkpoint copied into it meanwhile would corrupt that transfer."""
    state = {"w": torch.randn(16 << 20, generator=torch.Generator().manual_seed(5))}  # 64 MiB
    copy = copy_of(state)
    warm = torch.zeros(copy.manifest.total_bytes + 4096, dtype=torch.uint8)
    spare = SpareBuffer()
    spare.give(warm)
    live = LiveSnapshot(
        flatten(state),
        step=STEP,
        quorum_id=1,
        replica_id="donor",
        readers=frozenset({"h"}),
        spare=spare,
        chunk_bytes=CHUNK,
    )
    assert live.reused_buffer and spare.take() is None
    assert live.seal(wait_s=0.0) == "" and live.kept_bytes == copy.manifest.total_bytes
    state["w"].mul_(-1.0)  # the optimizer steps

    sender, receiver = socket.socketpair()
    with sender, receiver, ThreadPoolExecutor(1) as pool:
        sending = pool.submit(live.send, sender, 0, copy.manifest.total_bytes, "h")
        wait_until(lambda: live._kept_reads == 1, "send from the kept copy")  # 64 MiB outlast the socket buffers
        live.retire()
        assert spare.take() is None  # still being read
        received = bytearray()
        while len(received) < copy.manifest.total_bytes:
            received += receiver.recv(1 << 20)
        sending.result(DEADLINE_S)
    assert bytes(received) == bytes(copy.buffer.numpy())
    given_back = spare.take()
    assert given_back is not None and given_back.data_ptr() == warm.data_ptr()
    with pytest.raises(NotServed, match="no longer served"):
        live.check(0, CHUNK)


def test_a_state_server_retires_the_snapshots_it_stops_serving() -> None:
    spare = SpareBuffer()
    live = LiveSnapshot(
        flatten(big_state()),
        step=STEP,
        quorum_id=1,
        replica_id="donor",
        readers=frozenset({"h"}),
        spare=spare,
        chunk_bytes=CHUNK,
    )
    with serving(live) as (server, _):
        assert live.seal(wait_s=0.0) == "" and spare.take() is None
        server.retain({STEP})
        assert spare.take() is None
        server.retain(set())
        assert spare.take() is not None and server.published_steps == set()


def _liar(snapshot: Snapshot, **changes: Any) -> Snapshot:
    """The same bytes under a manifest that lies about the rest of the state (issue 19 bug 1)."""
    skeleton = msgpack.unpackb(msgpack.packb(snapshot.manifest.skeleton), strict_map_key=False)
    skeleton["cursor"] = 999_999
    skeleton["optimizer"]["param_groups"][0]["lr"] = 10.0
    return Snapshot(snapshot.buffer, dataclasses.replace(snapshot.manifest, skeleton=skeleton, **changes))


def test_two_donors_disagreeing_on_the_non_tensor_state_heal_from_neither() -> None:
    snapshot = sample_snapshot()
    with donors(("a-liar", _liar(snapshot), None), ("honest", snapshot, None)) as ds:
        with pytest.raises(HealError, match=r"donors \['a-liar', 'honest'\] disagree on the state of step 5"):
            fetch_state(ds, STEP, token=None, timeout_s=DEADLINE_S)


def test_an_outvoted_liar_is_not_healed_from_even_when_its_id_sorts_first() -> None:
    snapshot = sample_snapshot()
    with donors(("a-liar", _liar(snapshot), None), ("b", snapshot, None), ("c", snapshot, None)) as ds:
        result = fetch_state(ds, STEP, token=None, timeout_s=DEADLINE_S)
    state = unflatten(result.manifest.skeleton, result.tensors)
    assert state["cursor"] == 4096 and state["optimizer"]["param_groups"][0]["lr"] == 1e-3
    assert "a-liar" not in result.bytes_by_donor
    assert_same_state(result, snapshot)


def test_a_tensor_relabelled_to_another_dtype_is_refused_against_the_healers_own() -> None:
    snapshot = sample_snapshot()
    relabelled = tuple(
        dataclasses.replace(t, dtype="int32") if t.name == "state.model.w" else t for t in snapshot.manifest.tensors
    )
    own = flatten(sample_state())
    expected = {
        n: (str(t.dtype).removeprefix("torch."), tuple(t.shape)) for n, t in zip(own.names, own.tensors, strict=True)
    }
    liar = Snapshot(snapshot.buffer, dataclasses.replace(snapshot.manifest, tensors=relabelled))
    with donors(("liar", liar, None)) as ds:
        with pytest.raises(
            HealError, match=r"describes state.model.w as int32\[300000\]; this rank's is float32\[300000\]"
        ):
            fetch_state(ds, STEP, token=None, timeout_s=DEADLINE_S, expected=expected)


def test_a_state_larger_than_the_healer_expects_is_refused_before_anything_is_allocated() -> None:
    snapshot = sample_snapshot()
    huge = 64 * 2**30
    claim = dataclasses.replace(
        snapshot.manifest,
        skeleton={"w": {"__tensor__": 0}},
        tensors=(TensorSpec("state.w", "float32", (huge // 4,), 0, huge),),
        total_bytes=huge,
        chunk_bytes=2**30,
        checksums=(bytes(16),) * 64,
    )
    with donors(("liar", Snapshot(snapshot.buffer, claim), None)) as ds:
        with pytest.raises(HealError, match=f"claims {huge} bytes of state; this rank expects at most 1000000"):
            fetch_state(ds, STEP, token=None, timeout_s=DEADLINE_S, max_bytes=1_000_000)


def test_a_malformed_skeleton_is_refused_with_the_manifest_not_after_the_vote() -> None:
    snapshot = sample_snapshot()
    broken = Snapshot(snapshot.buffer, dataclasses.replace(snapshot.manifest, skeleton={"w": {"__tensor__": 99}}))
    with donors(("broken", broken, None)) as ds:
        with pytest.raises(HealError, match=r"Manifest.skeleton: state skeleton at state.w: tensor reference"):
            fetch_state(ds, STEP, token=None, timeout_s=DEADLINE_S)
