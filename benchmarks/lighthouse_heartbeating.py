"""Paced rounds with heartbeats: quorum latency and lighthouse CPU per step, as a job has them.

The lighthouse benchmark's unpaced rounds (benchmarks/lighthouse.py) ask back to back, and
torchft's members there send no heartbeats, so torchft's server CPU per round is a lower
bound. A training job asks once a step and heartbeats in between: a torchft manager every
100 ms on an RPC of its own whatever else it does (lighthouse_torchft.HEARTBEAT_INTERVAL_S),
ours on its session stream when the stream has been quiet for 0.1 s. Here both run that
way, with the same members and processes, after the unpaced rounds: each step is a pause of
:data:`STEP_GAP_S` (the step's compute), then our members' round and torchft's, their order
alternating; torchft's heartbeat threads run through the whole phase and ours heartbeat by
themselves. Both lighthouses see every step's wall time, so a lighthouse's CPU per round is
all its CPU over the phase (its rounds, the gaps and the heartbeats in them) over the number
of steps: what one lighthouse spends per step of a job whose steps last about
:data:`STEP_GAP_S` plus the two rounds.

Measuring the unpaced rounds with heartbeats instead was rejected: their CPU per round would
depend on how fast the benchmark happens to run its rounds, not on a step time one can name.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from benchmarks.processes import Child

HEARTBEAT_SIZES = (2, 8, 64, 256)
"""Members per paced phase: up to 256, where torchft's members are 128 heartbeat threads per
process; at 1,024 the 1,024 threads' 10,240 calls a second would measure this 2-core machine."""
STEP_GAP_S = 0.5
"""The pause before each step's rounds: a short training step, so a round's cost is visible."""
EVENT_S = 60.0

PacedMode = Literal["client", "torchft"]
PACED_MODES: tuple[PacedMode, ...] = ("client", "torchft")


@dataclass(slots=True)
class HeartbeatingSamples:
    """One paced phase: per-step latencies (ms) and each lighthouse's CPU over the phase."""

    latency_ms: dict[PacedMode, list[float]] = field(default_factory=lambda: {m: [] for m in PACED_MODES})
    server_cpu_s: dict[PacedMode, float] = field(default_factory=lambda: dict.fromkeys(PACED_MODES, 0.0))
    wall_s: float = 0.0
    torchft_heartbeats: int = 0
    """Heartbeat calls torchft's members completed during the phase."""

    def cpu_ms_per_round(self, mode: PacedMode) -> float:
        return 1e3 * self.server_cpu_s[mode] / len(self.latency_ms[mode])


async def heartbeating_rounds(
    one_round: Callable[[PacedMode], Awaitable[float]],
    servers: dict[PacedMode, Child],
    torchft_members: Sequence[Child],
    steps: int,
) -> HeartbeatingSamples:
    """``steps`` paced steps (see the module doc); ``one_round(mode)`` runs one round of a
    mode and returns its latency in ms."""
    samples = HeartbeatingSamples()
    beaten = await _toggle(torchft_members, "start")
    cpu_start = {m: s.cpu_seconds() for m, s in servers.items()}
    started = time.monotonic()
    for i in range(steps):
        await asyncio.sleep(STEP_GAP_S)
        for mode in PACED_MODES[i % 2 :] + PACED_MODES[: i % 2]:
            samples.latency_ms[mode].append(await one_round(mode))
    samples.wall_s = time.monotonic() - started
    for mode, server in servers.items():
        samples.server_cpu_s[mode] = server.cpu_seconds() - cpu_start[mode]
    samples.torchft_heartbeats = await _toggle(torchft_members, "stop") - beaten
    return samples


async def _toggle(members: Sequence[Child], how: Literal["start", "stop"]) -> int:
    """Start or stop every torchft member's heartbeat threads; returns the heartbeats sent so far."""
    for m in members:
        m.send_line(f"heartbeat {how}")
    deadline = time.monotonic() + EVENT_S
    reports = [await m.expect_event("heartbeats", deadline, running=how == "start") for m in members]
    return sum(r["sent"] for r in reports)
