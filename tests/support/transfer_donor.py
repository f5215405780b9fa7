"""A state donor as a real process, for tests/replicaft/transfer/test_transfer.py: serve a snapshot until killed.

    python tests/support/transfer_donor.py --num-bytes N --step S [--stall-mid-send] [--host 127.0.0.2]
        [--misplace-tensor]

Builds the deterministic snapshot of :func:`build_snapshot` (the test builds the same one in
process), serves it from a ``StateServer`` on loopback and prints one JSON line
``{"event": "serving", "address": ...}``. With ``--stall-mid-send`` the first range it serves
stops half-way: it prints ``{"event": "mid_send", "start", "stop", "sent"}`` once the first
half is on the wire and then sends nothing more, so a test can SIGKILL it while a healer is
part-way through receiving that range. With ``--misplace-tensor`` its manifest's skeleton puts
the model's tensor at ``state.model.v`` while its tensor list still names it ``state.model.w``
(a donor whose manifest is not one ``flatten`` made: issue 37).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import threading
from typing import Any

import torch

from replicaft.state.flat import flatten
from replicaft.transfer import server as server_module
from replicaft.transfer.server import StateServer
from replicaft.transfer.snapshot import Snapshot

CHUNK_BYTES = 1024 * 1024
SEND_PIECE_BYTES = 256 * 1024


def build_snapshot(num_bytes: int, step: int, replica_id: str, seed: int = 0) -> Snapshot:
    """The same bytes in every process: seeded int32 noise plus a little non-tensor state."""
    generator = torch.Generator().manual_seed(seed)
    weights = torch.randint(-(2**31), 2**31 - 1, (num_bytes // 4,), generator=generator, dtype=torch.int32)
    state = {"model": {"w": weights}, "step": step, "extras": {"cursor": step * 8, "betas": (0.9, 0.95)}}
    return Snapshot.capture(flatten(state), step=step, quorum_id=1, replica_id=replica_id, chunk_bytes=CHUNK_BYTES)


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


class StallHalfWay:
    """Stands in for the range's bytes: hands out pieces until half are sent, then blocks."""

    def __init__(self, data: memoryview, start: int, stop: int) -> None:
        self._data = data
        self._range = (start, stop)

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, piece: slice) -> memoryview:
        if piece.start >= len(self._data) // 2:
            emit("mid_send", start=self._range[0], stop=self._range[1], sent=piece.start)
            threading.Event().wait()
        return self._data[piece]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-bytes", type=int, required=True)
    parser.add_argument("--step", type=int, required=True)
    parser.add_argument("--replica-id", default="subprocess-donor")
    parser.add_argument("--stall-mid-send", action="store_true")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to serve on (another is another host)")
    parser.add_argument("--misplace-tensor", action="store_true", help="serve a skeleton at odds with the tensor list")
    args = parser.parse_args()

    snapshot = build_snapshot(args.num_bytes, args.step, args.replica_id)
    if args.misplace_tensor:
        skeleton = {**snapshot.manifest.skeleton, "model": {"v": snapshot.manifest.skeleton["model"]["w"]}}
        snapshot = dataclasses.replace(snapshot, manifest=dataclasses.replace(snapshot.manifest, skeleton=skeleton))
    hook = None
    if args.stall_mid_send:
        # Send in small pieces so that "half-way" is several pieces into the range.
        server_module.SEND_PIECE_BYTES = SEND_PIECE_BYTES

        def hook(start: int, stop: int, data: memoryview) -> Any:
            return StallHalfWay(data, start, stop)

    server = StateServer(args.host, fault_hook=hook)
    address = server.start()
    server.publish(snapshot)
    emit("serving", address=address, total_bytes=snapshot.manifest.total_bytes)
    threading.Event().wait()


if __name__ == "__main__":
    main()
