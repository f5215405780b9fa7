"""Lighthouse: fast-path quorum latency (2-1,024 members) and failure-notice latency.

Every step of training waits for a quorum, so the lighthouse's fast path (membership
unchanged: answer the moment the last member asks) sits on the critical path of every
step; and how soon survivors hear that a member died bounds how long they sit in a doomed
collective. torchft answers the second question with a 5 s heartbeat expiry.

What runs where. The lighthouse is the real server, ``python -m lighthouse`` in its own
process (a fresh one per measurement, generous join/heartbeat/progress timeouts so no
deadline fires by accident). Quorum members are coroutines, each an
:class:`AsyncLighthouseClient` with its own session (heartbeating when its stream has been
quiet for the client's default 0.1 s), spread over ``min(N, 2)`` client processes. gRPC
makes the clients of one process share a connection (lighthouse_workers.OWN_CONNECTION
says why and how the raw streams below avoid it). Two, not one: a single Python process
cannot issue 256 requests and decode 256 answers at once without being the bottleneck
itself; more than two would only add processes competing for this machine's two cores.
Failure notices use one OS process per member, since only a real SIGKILL closes the
connection the way a crashed group does.

At 1,024 members (2,048 sessions, 1,024 barrier streams and 1,024 unary channels, in two
client processes beside the lighthouse on this 2-core machine) the members must cost little,
or the figure measures them. Since protocol 3 a steady round's reply is a QuorumUpdate of a
few dozen bytes (lighthouse/wire/replies.py): a client-mode member applies it to its last quorum
(copying the steps column, ~5 µs at 1,024) instead of decoding 1,024 entries. The wire and
barrier members go further: they are not gRPC clients at all but HTTP/2 frames written and
read on a socket per member (benchmarks/raw_streams.py): a round is one ``send()`` per member
of a request encoded before it, and one reader callback per answer that decodes the small
reply envelope (wire) or compares the bytes (barrier). grpc.aio clients cost tens of
microseconds of Python per message each way: with them, the 1,024-member wire and barrier
p50s were 95 and 73 ms, with raw members 77 and 59 ms. What the member processes spend is
``params.member_cpu_ms_per_round``. The figures to read: ``quorum / torchft_quorum`` and the
lighthouse's CPU per round against torchft's (the same members' rounds against torchft 0.2.0's
Rust lighthouse, benchmarks/lighthouse_torchft.py says what differs), ``quorum_wire /
grpc_barrier`` (what the lighthouse adds to gRPC's own fan-in/fan-out), and how they grow
from 256 to 1,024 members (linearly if the CPU per round grows 4x).

What a quorum figure brackets. The benchmark releases all client processes at once; each
member takes ``time.monotonic()`` just before it asks and just after it has its answer
(one system-wide clock, see lighthouse_workers.py). A round's latency is latest "has its
answer" - latest "asked": from the moment the last member asks (the one every other member
waits for) until every member holds the answer. Five ways of asking are measured, interleaved
round by round, the first four with the same members and processes:

* ``quorum_ms_*``: ``AsyncLighthouseClient.quorum()``, the call the managers make: the
  request and its answer travel on the member's session stream, and the answer is decoded
  and validated (every column; each member's opaque ``data`` map, empty here, is checked
  for type and size and decoded only when the caller builds that member, as ``plan_step``
  does once per step). That costs ~80 µs per 256-member answer, so in this simulation
  the N answers arriving at one process still cost O(N²), serialised on one core (~10 ms
  per process per round at 256); on a real cluster each group decodes one answer, on its
  own machine. Its ratio is to torchft's (below); one gRPC round trip (``grpc_echo_ms_*``:
  a trivial grpc.aio echo server, generic handler, 100-byte payload, sequential unary
  calls) is recorded beside it, to read it as "this many RPC round trips".
* ``quorum_wire_ms_*``: the same request, encoded before the round, written on a raw
  session stream per member (HTTP/2 frames on a connection of its own, raw_streams.py), to
  a second lighthouse process of its own (a raw session registers a member, so it cannot
  share the first one's membership); only the reply's envelope is decoded: the lighthouse's
  latency as seen from the members' sockets, with as many connections as a real job opens.
* ``grpc_barrier_ms_*`` (baseline of the line above): the same raw streams, to a trivial
  grpc.aio server that answers every stream once the N-th message has arrived. It is the
  floor for this fan-in/fan-out on this machine with a grpc.aio server, so ``quorum_wire /
  grpc_barrier`` is what the lighthouse adds (rules, validation, sessions) over gRPC alone.
* ``grpc_unary_barrier_ms_*`` (baseline, no ratio): the same barrier as one unary call per
  member, the way quorums travelled before protocol version 2. It shows why they moved onto
  the session stream: grpc.aio costs far more per new call than per stream message.
* ``torchft_quorum_ms_*`` (baseline of ``quorum_ms_*``): N torchft LighthouseClients, in
  the same number of processes, calling torchft's lighthouse (benchmarks/lighthouse_torchft.py).
  Its members send no heartbeats in these rounds, so its CPU there is a lower bound.
* ``quorum_heartbeating_ms_*`` and ``lighthouse_cpu_ms_per_round_heartbeating_*`` (2 to 256
  members), against torchft's: the same members afterwards, in paced steps while torchft's
  heartbeat every 100 ms as its managers do and ours on their quiet sessions
  (benchmarks/lighthouse_heartbeating.py): the load a job puts on either lighthouse.

``lighthouse_cpu_ms_per_round_N`` is the CPU of the lighthouse a mode talks to during its
rounds divided by their number (heartbeat handling included), against the barrier server's
CPU per stream barrier round: when the per-round CPU approaches the round's latency, the
server is the bottleneck (it runs one event loop, so one core at most).

The failure-notice figure is the time from the benchmark's SIGKILL of one member to each
surviving member's ``on_notice`` callback receiving ``member_lost`` for it, one process per
member, repeated with a fresh victim each time.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from benchmarks.lighthouse_heartbeating import (
    HEARTBEAT_SIZES,
    PACED_MODES,
    STEP_GAP_S,
    HeartbeatingSamples,
    PacedMode,
    heartbeating_rounds,
)
from benchmarks.lighthouse_torchft import HEARTBEAT_INTERVAL_S, HEARTBEAT_TIMEOUT_MS, JOIN_TIMEOUT_MS, start_torchft
from benchmarks.processes import Child, ChildFailed, ChildProcesses
from benchmarks.results import BenchmarkResult

RoundMode = Literal["client", "wire", "barrier", "unary_barrier", "torchft"]
"""How a member asks: ``client``, through ``AsyncLighthouseClient.quorum`` (which decodes and
validates the answer); ``wire``, the same QuorumRequest, pre-encoded, on a raw session
stream, the quorum in the reply not decoded; ``barrier``, a message on a raw stream to the
echo server's ``Barrier`` instead of the lighthouse; ``unary_barrier``, one unary call per
member to the same barrier; ``torchft``, torchft 0.2.0's LighthouseClient.quorum to its own
lighthouse (benchmarks/lighthouse_torchft.py). ``wire`` and ``barrier`` differ only in the server."""

QUORUM_SIZES = (2, 8, 64, 256, 1024)
MODES: tuple[RoundMode, ...] = ("client", "wire", "barrier", "unary_barrier", "torchft")
MAX_CLIENT_PROCESSES = 2
LIGHTHOUSE_FLAGS = (
    "--port",
    "0",
    "--join-timeout",
    "60",
    "--heartbeat-timeout",
    "30",
    "--progress-timeout",
    "120",
    "--log-level",
    "WARNING",
)
"""Timeouts far above any round: a benchmark must measure the fast path and stream-close
detection, never a join timeout or a heartbeat expiry firing on a loaded machine."""
WORKERS = ("-m", "benchmarks.lighthouse_workers")
STARTUP_S = 240.0
"""Deadline for processes to start and members to register (1,024 sessions on a busy host)."""
ROUND_S = 60.0
NOTICE_S = 10.0
"""A notice later than this is a failure of the feature, not a slow measurement."""
TARGETS_MS = {
    "quorum_ms_p50_8": 5.0,
    "quorum_wire_ms_p50_8": 5.0,
    "quorum_ms_p50_256": 50.0,
    "quorum_wire_ms_p50_256": 50.0,
    "quorum_ms_p50_1024": 50.0,
    "quorum_wire_ms_p50_1024": 50.0,
    "notice_ms_p50": 1000.0,
}
"""The project's targets (the wire figures held to the same ones, to tell the lighthouse
from this simulation's client decoding); recorded as met or not, never tuned towards."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    rounds: Mapping[int, int]
    """Measured rounds per quorum size, per way of asking (fewer for large quorums, whose
    rounds are slower and whose samples vary less)."""
    warmup_rounds: int
    """Unmeasured rounds per way of asking; the first one forms the quorum by the slow path."""
    echo_calls: int
    notice_repeats: int
    notice_survivors: int
    heartbeating_steps: int
    """Paced steps with heartbeats per size in HEARTBEAT_SIZES (benchmarks/lighthouse_heartbeating.py)."""


FULL = Plan(
    rounds={2: 300, 8: 300, 64: 200, 256: 100, 1024: 40},
    warmup_rounds=5,
    echo_calls=1000,
    notice_repeats=10,
    notice_survivors=4,
    heartbeating_steps=40,
)
QUICK = Plan(
    rounds={2: 30, 8: 30, 64: 12, 256: 6, 1024: 4},
    warmup_rounds=2,
    echo_calls=200,
    notice_repeats=3,
    notice_survivors=3,
    heartbeating_steps=6,
)


@dataclass(slots=True)
class QuorumSamples:
    """Per-round latencies (ms) by way of asking, and the server CPU those rounds used."""

    latency_ms: dict[RoundMode, list[float]]
    server_cpu_s: dict[RoundMode, float]
    """CPU (user + system) of the server a mode talks to, summed over that mode's rounds:
    the lighthouse of ``client`` or of ``wire`` (its heartbeat handling included, as it is
    part of its load), the barrier server for the barriers."""
    member_cpu_s: dict[RoundMode, float]
    """CPU of the member processes, summed over that mode's rounds: what the simulation cost."""
    heartbeating: HeartbeatingSamples | None = None
    """The paced phase with heartbeats, for sizes in HEARTBEAT_SIZES."""

    def cpu_ms_per_round(self, *modes: RoundMode) -> float:
        return 1e3 * sum(self.server_cpu_s[m] for m in modes) / sum(len(self.latency_ms[m]) for m in modes)

    def member_cpu_ms_per_round(self, mode: RoundMode) -> float:
        return 1e3 * self.member_cpu_s[mode] / len(self.latency_ms[mode])


def run(*, quick: bool) -> BenchmarkResult:
    plan = QUICK if quick else FULL
    return asyncio.run(_measure(plan, quick))


async def _measure(plan: Plan, quick: bool) -> BenchmarkResult:
    echo_ms = await measure_echo(plan.echo_calls)
    quorum: dict[int, QuorumSamples] = {}
    failed: dict[str, str] = {}
    for n in QUORUM_SIZES:
        try:
            quorum[n] = await measure_quorum(n, plan)
        except (ChildFailed, RuntimeError) as e:
            # Reported with its reason and no figure, never a made-up one; the other sizes stand.
            print(f"lighthouse: rounds of {n} members could not be measured: {e}", flush=True)
            failed[str(n)] = str(e)[:2000]
    notice_ms = await measure_notice(plan)

    figures: dict[str, float] = {}
    baselines = {f"grpc_echo_ms_p{q}": percentile(echo_ms, q) for q in (50, 90)}
    compared_to: dict[str, str] = {}
    for n, samples in quorum.items():
        for q in (50, 90):
            figures[f"quorum_ms_p{q}_{n}"] = percentile(samples.latency_ms["client"], q)
            baselines[f"torchft_quorum_ms_p{q}_{n}"] = percentile(samples.latency_ms["torchft"], q)
            compared_to[f"quorum_ms_p{q}_{n}"] = f"torchft_quorum_ms_p{q}_{n}"
        for q in (50, 90):
            figures[f"quorum_wire_ms_p{q}_{n}"] = percentile(samples.latency_ms["wire"], q)
            baselines[f"grpc_barrier_ms_p{q}_{n}"] = percentile(samples.latency_ms["barrier"], q)
            compared_to[f"quorum_wire_ms_p{q}_{n}"] = f"grpc_barrier_ms_p{q}_{n}"
            baselines[f"grpc_unary_barrier_ms_p{q}_{n}"] = percentile(samples.latency_ms["unary_barrier"], q)
    for n, samples in quorum.items():
        figures[f"lighthouse_cpu_ms_per_round_{n}"] = samples.cpu_ms_per_round("client", "wire")
        baselines[f"grpc_barrier_cpu_ms_per_round_{n}"] = samples.cpu_ms_per_round("barrier")
        baselines[f"torchft_lighthouse_cpu_ms_per_round_{n}"] = samples.cpu_ms_per_round("torchft")
        if baselines[f"torchft_lighthouse_cpu_ms_per_round_{n}"] > 0:  # CPU is counted in 10 ms ticks
            compared_to[f"lighthouse_cpu_ms_per_round_{n}"] = f"torchft_lighthouse_cpu_ms_per_round_{n}"
    for n, samples in quorum.items():
        if (hb := samples.heartbeating) is None:
            continue
        for q in (50, 90):
            ours, theirs = f"quorum_heartbeating_ms_p{q}_{n}", f"torchft_quorum_heartbeating_ms_p{q}_{n}"
            figures[ours] = percentile(hb.latency_ms["client"], q)
            baselines[theirs] = percentile(hb.latency_ms["torchft"], q)
            compared_to[ours] = theirs
        ours = f"lighthouse_cpu_ms_per_round_heartbeating_{n}"
        theirs = f"torchft_{ours}"
        figures[ours] = hb.cpu_ms_per_round("client")
        baselines[theirs] = hb.cpu_ms_per_round("torchft")
        if baselines[theirs] > 0:
            compared_to[ours] = theirs
    figures["notice_ms_p50"] = percentile(notice_ms, 50)
    figures["notice_ms_max"] = max(notice_ms)

    met = {f: figures[f] < target for f, target in TARGETS_MS.items() if f in figures}
    return BenchmarkResult(
        name="lighthouse",
        figures=figures,
        baselines=baselines,
        compared_to=compared_to,
        notes=(
            "Lighthouse: a real `python -m lighthouse` process. Members: AsyncLighthouseClient coroutines in min(N, "
            f"{MAX_CLIENT_PROCESSES}) client processes (N/2 each), a session each, all asking at once. quorum_ms: "
            "last member asks -> every member holds the decoded, validated answer, asked and answered on its "
            "session stream as managers do (a whole quorum decoded when its roster changed, else a QuorumUpdate "
            "applied to the last one; members' opaque data maps, empty here, are decoded when a member is built, by "
            "plan_step), against torchft_quorum_ms: torchft 0.2.0's Rust LighthouseServer in its own process "
            "(min_replicas N, join timeout 60 s and heartbeat timeout 30 s as ours, RUST_LOG=warn), asked by N "
            "LighthouseClients (a connection and a thread each, the blocking unary Quorum call a torchft manager "
            "makes, whole quorum decoded in Rust) in the same number of processes, rounds interleaved with ours; "
            "its members send no separate heartbeats (a manager sends 10 a second), so its CPU is a lower bound. "
            "grpc_echo_ms: one sequential gRPC echo round trip. quorum_wire_ms: the same request on raw "
            "session streams to a second lighthouse, one connection per member, quorum in the reply not decoded, "
            "against grpc_barrier_ms: the same raw streams to a trivial grpc.aio server answering all N when the "
            "N-th message arrives (gRPC's floor for this fan-in/fan-out). Raw streams are not gRPC clients but "
            "HTTP/2 frames on a socket per member (benchmarks/raw_streams.py): one send() of a request encoded "
            "before the round and one reader callback per answer (params.member_cpu_ms_per_round: what the member "
            "processes spent per round, their client-mode sessions' heartbeats included), so the cores measure the "
            "server. lighthouse_cpu_ms_per_round: the lighthouse's CPU (client and wire rounds) per round, against "
            "torchft's lighthouse's CPU per torchft round (grpc_barrier_cpu: the barrier server's). "
            "grpc_unary_barrier_ms: that barrier as one grpc.aio unary call per member (how "
            "quorums travelled before protocol 2). notice_ms: SIGKILL of one member (own process) -> member_lost in "
            "each survivor's on_notice (own processes). "
            f"*_heartbeating_*: paced steps (a {STEP_GAP_S:g} s pause, then our round and torchft's, order "
            f"alternating) while torchft's members heartbeat every {HEARTBEAT_INTERVAL_S:g} s on a thread each "
            "(LighthouseClient.heartbeat, as a torchft manager does) and ours on their quiet session streams; "
            "lighthouse CPU per round there is each lighthouse's CPU over the whole phase, heartbeats included, "
            "per step (params.heartbeating)."
            + (
                f" Not measured (rounds did not complete; reasons in params): {sorted(failed)} members."
                if failed
                else ""
            )
        ),
        params={
            "quick": quick,
            "rounds": {str(n): r for n, r in plan.rounds.items()},
            "warmup_rounds": plan.warmup_rounds,
            "client_processes": {str(n): min(n, MAX_CLIENT_PROCESSES) for n in QUORUM_SIZES},
            "member_cpu_ms_per_round": {
                str(n): {mode: round(samples.member_cpu_ms_per_round(mode), 2) for mode in MODES}
                for n, samples in quorum.items()
            },
            "echo_calls": plan.echo_calls,
            "notice_survivors": plan.notice_survivors,
            "notice_repeats": plan.notice_repeats,
            "lighthouse_flags": " ".join(LIGHTHOUSE_FLAGS),
            "torchft_lighthouse": {"join_timeout_ms": JOIN_TIMEOUT_MS, "heartbeat_timeout_ms": HEARTBEAT_TIMEOUT_MS},
            "targets_ms": TARGETS_MS,
            "targets_met": met,
            "sizes_not_measured": failed,
            "heartbeating": {
                "step_gap_s": STEP_GAP_S,
                "steps": plan.heartbeating_steps,
                "modes": list(PACED_MODES),
                "torchft_heartbeat_interval_s": HEARTBEAT_INTERVAL_S,
                "by_size": {
                    str(n): {
                        "wall_s": round(samples.heartbeating.wall_s, 2),
                        "torchft_heartbeats_per_member_per_s": round(
                            samples.heartbeating.torchft_heartbeats / n / samples.heartbeating.wall_s, 2
                        ),
                    }
                    for n, samples in quorum.items()
                    if samples.heartbeating is not None
                },
            },
        },
    )


def percentile(samples: list[float], q: int) -> float:
    """The q-th percentile, interpolating between samples (numpy's default method)."""
    if len(samples) == 1:
        return samples[0]
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1]


async def measure_echo(num_calls: int) -> list[float]:
    """Round-trip times (ms) of sequential gRPC echo calls between two fresh processes."""
    async with ChildProcesses() as children:
        deadline = time.monotonic() + STARTUP_S
        server = await children.start_python("echo-server", *WORKERS, "echo-server")
        address = (await server.expect_event("serving", deadline))["address"]
        client = await children.start_python(
            "echo-client", *WORKERS, "echo-client", "--address", address, "--calls", str(num_calls)
        )
        return (await client.expect_event("samples", deadline + ROUND_S))["ms"]


async def _start_lighthouse(children: ChildProcesses, name: str = "lighthouse") -> tuple[Child, str]:
    lighthouse = await children.start_python(name, "-m", "lighthouse", *LIGHTHOUSE_FLAGS)
    address = await lighthouse.expect_line("lighthouse serving gRPC at ", time.monotonic() + STARTUP_S)
    return lighthouse, address


async def measure_quorum(num_members: int, plan: Plan) -> QuorumSamples:
    """Rounds of ``num_members`` against fresh lighthouses and barrier (see the module doc)."""
    replica_ids = [f"m{i:03d}" for i in range(num_members)]
    num_processes = min(num_members, MAX_CLIENT_PROCESSES)
    async with ChildProcesses() as children:
        lighthouse, address = await _start_lighthouse(children)
        wire_lighthouse, wire_address = await _start_lighthouse(children, "wire-lighthouse")
        barrier = await children.start_python("barrier-server", *WORKERS, "echo-server")
        barrier_address = (await barrier.expect_event("serving", time.monotonic() + STARTUP_S))["address"]
        members = [
            await children.start_python(
                f"members-{k}",
                *WORKERS,
                "quorum-members",
                "--address",
                address,
                "--wire-address",
                wire_address,
                "--barrier-address",
                barrier_address,
                "--ids",
                ",".join(replica_ids[k::num_processes]),
            )
            for k in range(num_processes)
        ]
        deadline = time.monotonic() + STARTUP_S
        for m in members:
            await m.expect_event("ready", deadline)
        torchft, torchft_members = await start_torchft(children, replica_ids, num_processes, deadline)

        samples = QuorumSamples({m: [] for m in MODES}, dict.fromkeys(MODES, 0.0), dict.fromkeys(MODES, 0.0))
        step = 0

        async def one_round(mode: RoundMode, record: bool) -> float:
            nonlocal step
            step += 1
            server = {"client": lighthouse, "wire": wire_lighthouse, "torchft": torchft}.get(mode, barrier)
            askers = torchft_members if mode == "torchft" else members
            cpu_start = server.cpu_seconds()
            member_cpu_start = sum(m.cpu_seconds() for m in askers)
            for m in askers:
                m.send_line(f"go {step} {mode} {num_members}")
            deadline = time.monotonic() + ROUND_S
            reports = [await m.expect_event("round", deadline, step=step) for m in askers]
            cpu_s = server.cpu_seconds() - cpu_start
            member_cpu_s = sum(m.cpu_seconds() for m in askers) - member_cpu_start
            for r in reports:
                if r["size"] != num_members:
                    raise RuntimeError(
                        f"{mode} round {step} answered {r['size']} members, expected {num_members}; "
                        "a member was dropped, so this is not the fast path being measured"
                    )
            latency_ms = 1e3 * (max(r["last_recv"] for r in reports) - max(r["last_send"] for r in reports))
            if record:
                samples.latency_ms[mode].append(latency_ms)
                samples.server_cpu_s[mode] += cpu_s
                samples.member_cpu_s[mode] += member_cpu_s
            return latency_ms

        for _ in range(plan.warmup_rounds):
            for mode in MODES:
                await one_round(mode, record=False)
        for i in range(plan.rounds[num_members]):
            # Rotate which way of asking goes first, so none always follows another.
            for mode in MODES[i % len(MODES) :] + MODES[: i % len(MODES)]:
                await one_round(mode, record=True)

        async def paced_round(mode: PacedMode) -> float:
            return await one_round(mode, record=False)

        if num_members in HEARTBEAT_SIZES:
            samples.heartbeating = await heartbeating_rounds(
                paced_round, {"client": lighthouse, "torchft": torchft}, torchft_members, plan.heartbeating_steps
            )
    return samples


async def measure_notice(plan: Plan) -> list[float]:
    """Milliseconds from SIGKILL of a member to each survivor's ``member_lost`` notice."""
    async with ChildProcesses() as children:
        _, address = await _start_lighthouse(children)
        survivors = [
            await children.start_python(
                f"survivor-{i}", *WORKERS, "notice-member", "--address", address, "--id", f"survivor-{i}"
            )
            for i in range(plan.notice_survivors)
        ]
        deadline = time.monotonic() + STARTUP_S
        for s in survivors:
            await s.expect_event("ready", deadline)
        latencies_ms: list[float] = []
        for rep in range(plan.notice_repeats):
            victim_id = f"victim-{rep}"
            victim = await children.start_python(
                victim_id, *WORKERS, "notice-member", "--address", address, "--id", victim_id
            )
            await victim.expect_event("ready", time.monotonic() + STARTUP_S)
            killed_at = time.monotonic()
            victim.kill()
            deadline = killed_at + NOTICE_S
            for s in survivors:
                notice = await s.expect_event("notice", deadline, kind="member_lost", subject=victim_id)
                latencies_ms.append((notice["t"] - killed_at) * 1e3)
            await victim.wait(deadline)
    return latencies_ms
