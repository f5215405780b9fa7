"""One process of the heal benchmark: a donor, a healer, or one end of a baseline transfer.

Every role prints JSON lines on stdout (``{"event": ...}``) and nothing else. Passive roles
(donors, senders) print ``ready`` with the address they serve and then wait for stdin to
close. Active roles (receivers) print ``ready``, then for every JSON command line on stdin
perform one transfer and print ``done`` with the seconds the transfer took, the process CPU
seconds and the minor page faults it caused, all measured in the receiving process:

* ``donor``: builds the state and serves it with a ``StateServer`` bound to ``--host`` as
  a donor's manager does: a ``LiveSnapshot`` of the live tensors (transfer/live.py), never
  sealed (the benchmark's heal fits in the donor's step).
* ``healer``: ``{"donors": [[replica_id, address], ...], "step": S}`` -> ``fetch_state``
  timed from the call (manifests first) to the verified tensors, plus a breakdown of where
  the healer's time went (``recv_s``: seconds inside ``recv_hashed_into``, the receive with
  the chunk digest fed as the bytes land, summed over the donor threads; ``verify_s``: one
  thread hashing the received tensors again after the heal, in receive-sized pieces, the
  digest's cost on bytes no longer in cache; ``manifest_s``, from the call until every manifest was
  in). With ``"in_place": true, "bytes": N`` it receives into a state of its own of the
  donor's shape (allocated and written once, before the first such command, as a healer's
  model and optimizer are), as replicaft's manager does; without, into new memory.
* ``raw-send`` / ``raw-recv``: a plain TCP socket; the sender answers a 16-byte request
  (start, stop) with ``sendall`` of that range of its buffer, the receiver ``recv_into``'s a
  preallocated buffer (written once before the first transfer, so its pages exist), or with
  ``"fresh": true`` a ``torch.empty`` buffer allocated for that transfer (pages faulted in
  during the receive, as in replicaft's healer). With ``"streams": k`` the receiver splits
  the buffer into k ranges received over k connections at once, one thread each (as
  replicaft's healer pulls one donor over several connections).
* ``http-send`` / ``http-recv``: torchft 0.2.0 ``HTTPTransport`` with its defaults
  (``num_chunks=0``): ``send_checkpoint`` once, then timed ``recv_checkpoint`` calls.
* ``pg``: torchft 0.2.0 ``PGTransport`` over torchft's ``ProcessGroupGloo`` of two ranks
  (rank 0 hosts the TCPStore and sends, rank 1 receives; defaults: no in-place state dict).
  Both ranks take a command, meet in a one-element allreduce, then send / timed receive.

``--tls-dir DIR`` (the benchmark's throw-away CA: ca.pem, cert.pem, key.pem): donors and
``raw-send`` serve a second listener over TLS (mutual, as a job's state servers do; the same
buffer or live tensors), announced as ``tls_address``; a receiver's command with ``"tls": true``
connects to that one (``fetch_state(..., tls=...)``; the raw receiver wraps its sockets with
the same client context: the limit Python's ssl module sets).

``--netns NAME`` re-executes the worker under ``ip netns exec NAME`` (same pid, so the
benchmark's deadlines and kills still apply).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import ssl
import struct
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

NUM_TENSORS = 4
STEP = 7
TIMEOUT_S = 600.0
_RANGE = struct.Struct(">QQ")
_NETNS_ENV = "REPLICAFT_HEAL_BENCH_NETNS"


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def commands() -> Any:
    """JSON command lines from stdin until it closes (the benchmark closes it or dies)."""
    for line in sys.stdin:
        if line.strip():
            yield json.loads(line)


def tls_files(args: argparse.Namespace) -> Any:
    """The benchmark's TLS files (lighthouse.tls.files.TlsFiles), or None without ``--tls-dir``."""
    if not args.tls_dir:
        return None
    from lighthouse.tls.files import TlsFiles

    d = args.tls_dir
    return TlsFiles(cert=os.path.join(d, "cert.pem"), key=os.path.join(d, "key.pem"), ca=os.path.join(d, "ca.pem"))


def wait_for_stdin_eof() -> None:
    for _ in sys.stdin:
        pass


class Measured:
    """Wall and CPU seconds and minor page faults of this process across a ``with`` block."""

    def __enter__(self) -> Measured:
        self._faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        self._cpu = time.process_time()
        self.started = self._wall = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._wall
        self.fields = {
            "seconds": self.seconds,
            "cpu_s": time.process_time() - self._cpu,
            "minor_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - self._faults,
        }


def make_state(num_bytes: int) -> dict[str, Any]:
    """A few large float32 tensors holding ``num_bytes`` together, identical in every process."""
    import torch

    per = num_bytes // (4 * NUM_TENSORS)
    state: dict[str, Any] = {}
    for i in range(NUM_TENSORS):
        n = per if i < NUM_TENSORS - 1 else num_bytes // 4 - per * (NUM_TENSORS - 1)
        state[f"layer{i}.weight"] = torch.arange(n, dtype=torch.float32).mul_(1e-3).add_(i)
    state["step"] = STEP
    return state


def state_bytes(state: Any) -> int:
    import torch

    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    return 0


# ---- replicaft --------------------------------------------------------------------------


def donor(args: argparse.Namespace) -> None:
    from replicaft.state.flat import flatten
    from replicaft.transfer.live import LiveSnapshot
    from replicaft.transfer.server import StateServer

    state = make_state(args.bytes)
    started = time.perf_counter()
    snapshot = LiveSnapshot(flatten(state), step=STEP, quorum_id=1, replica_id=args.name, readers=frozenset())
    capture_s = time.perf_counter() - started
    server = StateServer(args.host)
    address = server.start()
    server.publish(snapshot)
    tls = tls_files(args)
    tls_server = StateServer(args.host, tls=tls.server_context()) if tls else None
    tls_address = tls_server.start() if tls_server else None
    if tls_server:
        tls_server.publish(snapshot)
    emit(
        "ready",
        address=address,
        tls_address=tls_address,
        capture_s=capture_s,
        total_bytes=snapshot.manifest.total_bytes,
    )
    wait_for_stdin_eof()
    server.stop()
    if tls_server:
        tls_server.stop()


class _Timer:
    """Wall seconds spent inside wrapped functions, summed over threads."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                with self._lock:
                    self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

        return timed


def hash_seconds(tensors: list[Any]) -> float:
    """Seconds one thread takes to feed ``tensors``' bytes to the chunk digest in receive-sized
    pieces, after the heal: the verification's cost on bytes no longer in cache (in the heal
    each piece is hashed right after its ``recv_into``), without timing each ``update`` inside
    the heal, which cost the timed heal ~4 % of its time."""
    from replicaft.state.flat import tensor_bytes
    from replicaft.transfer.checksum import RECV_PIECE_BYTES, ChunkHash

    started = time.perf_counter()
    for tensor in tensors:
        view = memoryview(tensor_bytes(tensor).numpy())
        running = ChunkHash()
        for i in range(0, len(view), RECV_PIECE_BYTES):
            running.update(view[i : i + RECV_PIECE_BYTES])
        running.digest()
    return time.perf_counter() - started


def healer(args: argparse.Namespace) -> None:
    import replicaft.transfer.client as client
    import replicaft.transfer.stripes as stripes

    timer = _Timer()
    # The stripes module imported it by name; wrapping its reference times the stripe receive
    # (with the digest fed as the bytes land), once per piece a chunk lands in, without
    # touching replicaft.
    stripes.recv_hashed_into = timer.wrap("recv_s", stripes.recv_hashed_into)
    placed_at: list[float] = []
    place = client.Placement

    def placement(*a: Any, **k: Any) -> Any:
        placed_at.append(time.perf_counter())  # every manifest is in; the ranges come next
        return place(*a, **k)

    client.Placement = placement
    from replicaft.state.flat import flatten

    tls = tls_files(args)
    emit("ready")
    own: dict[str, Any] | None = None
    for cmd in commands():
        donors = [client.Donor(rid, address) for rid, address in cmd["donors"]]
        into = None
        if cmd.get("in_place"):
            if own is None:  # the healer's own model and optimizer state: allocated once, pages written
                flat = flatten(make_state(cmd["bytes"]))
                own = dict(zip(flat.names, flat.tensors, strict=True))
            into = own
        timer.seconds.clear()
        placed_at.clear()
        with Measured() as m:
            context = tls.client_context() if cmd.get("tls") else None
            result = client.fetch_state(donors, cmd["step"], token=None, timeout_s=TIMEOUT_S, into=into, tls=context)
        timer.seconds["manifest_s"] = placed_at[0] - m.started
        num_bytes = result.manifest.total_bytes
        if into is not None and result.in_place_bytes < num_bytes * 0.99:
            raise RuntimeError(f"only {result.in_place_bytes} of {num_bytes} bytes were received in place")
        timer.seconds["verify_s"] = hash_seconds(result.tensors)
        del result
        emit("done", num_bytes=num_bytes, **m.fields, **{k: round(v, 6) for k, v in timer.seconds.items()})


# ---- raw socket -------------------------------------------------------------------------


def raw_send(args: argparse.Namespace) -> None:
    import torch

    buffer = torch.full((args.bytes,), 7, dtype=torch.uint8)  # pages written, like a snapshot's
    view = memoryview(buffer.numpy())
    listener = socket.create_server((args.host, 0))
    tls = tls_files(args)
    server_context = tls.server_context() if tls else None

    def serve(conn: socket.socket, secure: bool) -> None:
        if secure:
            assert server_context is not None
            conn = server_context.wrap_socket(conn, server_side=True)
        with conn:
            while True:
                request = bytearray(_RANGE.size)
                try:
                    recv_exact(conn, memoryview(request))
                except ConnectionError:
                    return
                start, stop = _RANGE.unpack(request)
                conn.sendall(view[start:stop])

    def accept(on: socket.socket, secure: bool) -> None:
        while True:
            conn, _ = on.accept()
            threading.Thread(target=serve, args=(conn, secure), daemon=True).start()

    threading.Thread(target=accept, args=(listener, False), daemon=True).start()
    host, port = listener.getsockname()[:2]
    tls_address = None
    if tls:
        tls_listener = socket.create_server((args.host, 0))
        threading.Thread(target=accept, args=(tls_listener, True), daemon=True).start()
        tls_address = f"{host}:{tls_listener.getsockname()[1]}"
    emit("ready", address=f"{host}:{port}", tls_address=tls_address)
    wait_for_stdin_eof()


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    while view:
        n = sock.recv_into(view)
        if n == 0:
            raise ConnectionError("peer closed")
        view = view[n:]


def _recv_range(sock: socket.socket, view: memoryview, start: int, stop: int) -> None:
    sock.sendall(_RANGE.pack(start, stop))
    recv_exact(sock, view[start:stop])


def raw_recv(args: argparse.Namespace) -> None:
    import torch  # the allocator replicaft's healer uses (numpy's would ask for huge pages)

    preallocated = torch.zeros(args.bytes, dtype=torch.uint8).numpy()  # every page faulted in now
    tls = tls_files(args)
    emit("ready")
    for cmd in commands():
        host, port = cmd["address"].rsplit(":", 1)
        streams = cmd.get("streams", 1)
        bounds = [args.bytes * i // streams for i in range(streams + 1)]
        with Measured() as m:
            buffer = torch.empty(args.bytes, dtype=torch.uint8).numpy() if cmd.get("fresh") else preallocated
            view = memoryview(buffer)
            sockets = [socket.create_connection((host, int(port)), timeout=TIMEOUT_S) for _ in range(streams)]
            if cmd.get("tls"):
                context: ssl.SSLContext = tls.client_context()
                sockets = [context.wrap_socket(sock, server_hostname=host) for sock in sockets]
            with ThreadPoolExecutor(streams) as pool:
                receives = [
                    pool.submit(_recv_range, sock, view, start, stop)
                    for sock, start, stop in zip(sockets, bounds, bounds[1:], strict=False)
                ]
                for receive in receives:
                    receive.result()
            for sock in sockets:
                sock.close()
        del view, buffer
        emit("done", num_bytes=args.bytes, **m.fields)


# ---- torchft 0.2.0 ----------------------------------------------------------------------


def http_send(args: argparse.Namespace) -> None:
    from datetime import timedelta

    from torchft.checkpointing.http_transport import HTTPTransport

    timeout = timedelta(seconds=TIMEOUT_S)
    transport: HTTPTransport[Any] = HTTPTransport(timeout=timeout, num_chunks=0)
    transport.send_checkpoint(dst_ranks=[1], step=STEP, state_dict=make_state(args.bytes), timeout=timeout)
    emit("ready", address=transport.metadata())
    wait_for_stdin_eof()
    transport.shutdown(wait=False)


def http_recv(args: argparse.Namespace) -> None:
    from datetime import timedelta

    from torchft.checkpointing.http_transport import HTTPTransport

    timeout = timedelta(seconds=TIMEOUT_S)
    transport: HTTPTransport[Any] = HTTPTransport(timeout=timeout, num_chunks=0)
    emit("ready")
    for cmd in commands():
        with Measured() as m:
            state = transport.recv_checkpoint(src_rank=0, metadata=cmd["address"], step=STEP, timeout=timeout)
        num_bytes = state_bytes(state)
        del state
        emit("done", num_bytes=num_bytes, **m.fields)
    transport.shutdown(wait=False)


def pg(args: argparse.Namespace) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torchft.checkpointing.pg_transport import PGTransport
    from torchft.process_group import ProcessGroupGloo

    timeout = timedelta(seconds=TIMEOUT_S)
    store = None
    if args.rank == 0:
        store = dist.TCPStore(args.host, 0, is_master=True, wait_for_workers=False, timeout=timeout)
        emit("store", address=f"{args.host}:{store.port}")
        store_address = f"{args.host}:{store.port}"
    else:
        store_address = args.store
    group = ProcessGroupGloo(timeout=timeout)
    group.configure(f"{store_address}/heal", "0", args.rank, 2)
    transport: PGTransport[Any] = PGTransport(group, timeout=timeout, device=torch.device("cpu"))
    state = make_state(args.bytes) if args.rank == 0 else None
    received: Any = None
    one = torch.zeros(1)
    group.allreduce([one], dist.ReduceOp.SUM).wait(timeout)
    emit("ready")
    for _ in commands():
        group.allreduce([one], dist.ReduceOp.SUM).wait(timeout)
        with Measured() as m:
            if args.rank == 0:
                transport.send_checkpoint(dst_ranks=[1], step=STEP, state_dict=state, timeout=timeout)
            else:
                received = transport.recv_checkpoint(
                    src_rank=0, metadata=transport.metadata(), step=STEP, timeout=timeout
                )
        num_bytes = state_bytes(state if args.rank == 0 else received)
        received = None
        emit("done", num_bytes=num_bytes, **m.fields)
    del store  # rank 0 hosts it until the end


ROLES: dict[str, Callable[[argparse.Namespace], None]] = {
    "donor": donor,
    "healer": healer,
    "raw-send": raw_send,
    "raw-recv": raw_recv,
    "http-send": http_send,
    "http-recv": http_recv,
    "pg": pg,
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=sorted(ROLES))
    p.add_argument("--bytes", type=int, default=0, help="state size in bytes")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (senders, donors, the PG store)")
    p.add_argument("--name", default="d0", help="donor replica id")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--store", help="host:port of rank 0's TCPStore (pg rank 1)")
    p.add_argument("--netns", help="run inside this network namespace (via `ip netns exec`)")
    p.add_argument("--tls-dir", help='serve (donors, raw-send) or connect (with "tls": true) over TLS with these files')
    args = p.parse_args()
    if args.netns and os.environ.get(_NETNS_ENV) != args.netns:
        os.environ[_NETNS_ENV] = args.netns
        os.execvp(
            "ip", ["ip", "netns", "exec", args.netns, sys.executable, "-m", "benchmarks.heal_worker", *sys.argv[1:]]
        )
    ROLES[args.role](args)


if __name__ == "__main__":
    main()
