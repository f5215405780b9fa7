"""torchft 0.2.0's lighthouse in the lighthouse benchmark, driven the way ours is.

Issue 41 asks for the lighthouse at scale beside torchft's: its Rust ``LighthouseServer``
(``torchft._torchft``, the server the ``torchft_lighthouse`` command runs) in a process of
its own, so its CPU is read from /proc exactly as ours is, and N members spread over the
same ``min(N, 2)`` client processes, all asking at once, round after round, interleaved with
our modes (``benchmarks.lighthouse.RoundMode`` ``torchft``).

A member is what a torchft ManagerServer is to the lighthouse: its own
``LighthouseClient`` (a tonic channel, a connection of its own) making the blocking unary
``Quorum`` call. The call blocks its thread (the GIL released), so each member has a thread,
started before the first round and reused for every round.

What differs from ours, so the figures are read fairly:

* Quorum rules. ``min_replicas`` is N, so the first quorum waits for every member; the join
  timeout (60 s, as ours) never fires: torchft forms a quorum as soon as every heartbeating
  replica has asked, and every later round takes its fast path (every member of the
  previous quorum has asked again), answered the moment the last member asks, as ours is.
* Heartbeats. A torchft manager heartbeats every 100 ms on a second RPC (its ManagerServer's
  ``heartbeat_interval`` default), whatever else it is doing. In the unpaced rounds these
  members do not (each Quorum call counts as one, and the 30 s heartbeat timeout, as ours,
  never expires), so the torchft server's CPU per round there is a lower bound. Between
  ``heartbeat start`` and ``heartbeat stop`` each member also runs a thread that calls
  ``LighthouseClient.heartbeat`` every :data:`HEARTBEAT_INTERVAL_S` on its own client (the
  manager's heartbeat loop shares its lighthouse channel, as here): the paced rounds with
  heartbeats (benchmarks.lighthouse, ``heartbeating``). Ours heartbeat on their session
  stream whenever it has been quiet for 0.1 s, in every round.
* Logging. torchft logs every quorum request at INFO; the server runs with
  ``RUST_LOG=warn``, as ours runs at ``--log-level WARNING``.
* Answers. Each call returns the whole quorum (N members) decoded by prost in Rust; the
  Python ``Quorum`` object converts its participants only when they are read, which the
  members do once per process per round, after the clock stopped, to check the size.

Protocol as benchmarks/lighthouse_workers.py's: commands on stdin, JSON events on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from benchmarks.processes import Child, ChildProcesses

JOIN_TIMEOUT_MS = 60_000
HEARTBEAT_TIMEOUT_MS = 30_000
"""Ours runs at --join-timeout 60 --heartbeat-timeout 30 (benchmarks.lighthouse.LIGHTHOUSE_FLAGS)."""
SERVER_ENV = {"RUST_LOG": "warn"}
WORKER = ("-m", "benchmarks.lighthouse_torchft")
WAIT_S = 60.0
"""Deadline for connecting and for each quorum call, as lighthouse_workers.WAIT_S."""
HEARTBEAT_INTERVAL_S = 0.1
"""torchft 0.2.0's ``Manager(heartbeat_interval=timedelta(milliseconds=100))`` default."""


def _emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def start_torchft(
    children: ChildProcesses, replica_ids: list[str], num_processes: int, deadline: float
) -> tuple[Child, list[Child]]:
    """torchft's lighthouse for ``replica_ids`` and its member processes, once all are ready."""
    server = await children.start_python(
        "torchft-lighthouse",
        *WORKER,
        "server",
        "--min-replicas",
        str(len(replica_ids)),
        env={**os.environ, **SERVER_ENV},
    )
    address = (await server.expect_event("serving", deadline))["address"]
    members = [
        await children.start_python(
            f"torchft-members-{k}",
            *WORKER,
            "members",
            "--address",
            address,
            "--ids",
            ",".join(replica_ids[k::num_processes]),
            env={**os.environ, **SERVER_ENV},
        )
        for k in range(num_processes)
    ]
    for m in members:
        await m.expect_event("ready", deadline)
    return server, members


def serve(min_replicas: int) -> None:
    """torchft's LighthouseServer on a free port until stdin closes."""
    from torchft._torchft import LighthouseServer

    server = LighthouseServer(
        bind="127.0.0.1:0",
        min_replicas=min_replicas,
        join_timeout_ms=JOIN_TIMEOUT_MS,
        heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS,
    )
    _emit("serving", address=server.address())
    try:
        sys.stdin.read()
    finally:
        server.shutdown()


def members(address: str, replica_ids: list[str]) -> None:
    """A LighthouseClient and a thread per member; on each ``go STEP ...`` line every member
    calls Quorum at once, and the process reports when its first and last calls left and
    answers came back, and the size of the quorum they got."""
    from torchft._torchft import LighthouseClient

    clients = [LighthouseClient(address, timedelta(seconds=WAIT_S)) for _ in replica_ids]
    pool = ThreadPoolExecutor(max_workers=len(replica_ids), thread_name_prefix="member")
    started = threading.Barrier(len(replica_ids) + 1, timeout=WAIT_S)
    # Every thread of the pool exists before the first round (a pool starts them lazily).
    held = [pool.submit(started.wait) for _ in replica_ids]
    started.wait()
    for f in held:
        f.result(WAIT_S)
    _emit("ready", members=len(clients))

    def ask(client: Any, replica_id: str, step: int) -> tuple[float, float, Any]:
        asked = time.monotonic()
        quorum = client.quorum(replica_id=replica_id, timeout=timedelta(seconds=WAIT_S), step=step)
        return asked, time.monotonic(), quorum

    beating = Heartbeats(clients, replica_ids)
    for line in sys.stdin:
        if line.startswith("heartbeat"):
            _emit("heartbeats", running=beating.toggle(line.split()[1] == "start"), sent=beating.sent)
            continue
        step = int(line.split()[1])
        calls = [pool.submit(ask, c, rid, step) for c, rid in zip(clients, replica_ids, strict=True)]
        answers = [f.result(WAIT_S + 1) for f in calls]
        ids = {a[2].quorum_id for a in answers}
        if len(ids) != 1:
            raise RuntimeError(f"round {step}: members got different quorums {sorted(ids)}")
        _emit(
            "round",
            step=step,
            size=len(answers[0][2].participants),
            first_send=min(a[0] for a in answers),
            last_send=max(a[0] for a in answers),
            first_recv=min(a[1] for a in answers),
            last_recv=max(a[1] for a in answers),
        )
    beating.toggle(False)
    pool.shutdown()


class Heartbeats:
    """A thread per member calling ``heartbeat`` every :data:`HEARTBEAT_INTERVAL_S` while on,
    as a torchft manager's heartbeat loop does; ``sent`` counts the calls that returned."""

    def __init__(self, clients: list[Any], replica_ids: list[str]) -> None:
        self._members = list(zip(clients, replica_ids, strict=True))
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.sent = 0

    def toggle(self, on: bool) -> bool:
        """Start (``on``) or stop and join every thread; returns whether they run now."""
        if on and not self._threads:
            self._stop.clear()
            self._threads = [threading.Thread(target=self._beat, args=m, daemon=True) for m in self._members]
            for t in self._threads:
                t.start()
        elif not on and self._threads:
            self._stop.set()
            for t in self._threads:
                t.join(WAIT_S)
            self._threads = []
        return bool(self._threads)

    def _beat(self, client: Any, replica_id: str) -> None:
        while not self._stop.wait(HEARTBEAT_INTERVAL_S):
            client.heartbeat(replica_id, timeout=timedelta(seconds=WAIT_S))
            with self._lock:
                self.sent += 1


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.lighthouse_torchft")
    roles = p.add_subparsers(dest="role", required=True)
    sv = roles.add_parser("server")
    sv.add_argument("--min-replicas", type=int, required=True)
    mb = roles.add_parser("members")
    mb.add_argument("--address", required=True)
    mb.add_argument("--ids", required=True, help="comma-separated replica ids")
    args = p.parse_args(argv)
    if args.role == "server":
        serve(args.min_replicas)
    else:
        members(args.address, args.ids.split(","))


if __name__ == "__main__":
    main()
