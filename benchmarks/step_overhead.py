"""Step overhead: replicaft's fault-tolerant step vs plain torch DDP, same processes, same model.

Both sides run two trainer processes (Gloo on CPU, one intra-op thread each, so the two
processes share this machine's two cores the same way) training the same stack of
1024x1024 linear layers with SGD on a fixed batch. Plain DDP is
``torch.nn.parallel.DistributedDataParallel`` over ``init_process_group("gloo")``; replicaft
is two replica groups of one rank each (``replicaft.DistributedDataParallel`` +
``replicaft.Optimizer``) plus a lighthouse process, state digests off. A step is timed from
``zero_grad`` to the end of ``step`` (so replicaft's quorum, vote and fence are inside it);
the figure is the median over timed steps of the slower of the two trainers. DDP and
replicaft runs alternate (``RUNS``: five of 200 timed steps a side at 10 MB, three of 100 at
100 MB; which side goes first alternates too), and the medians of those runs are compared;
``params.runs_ms_<size>mb`` keeps every pair, so the spread is in the results. (Two runs of
25 steps moved the 10 MB ratio between 1.09x and 1.31x from one invocation to the next on
this shared machine, and three of 100 between 1.18x and 1.21x; the gap being measured is
1-2 ms of a ~14 ms step, and single pairs of 300 steps ranged 1.03x-1.17x.)

Where the gap goes (``params.gap_ms_<size>mb``). Both sides time the same four calls of every
step (``zero_grad``, ``forward``, ``backward``, ``step``), so the gap of the mean step splits
exactly into the four segments' gaps, which add up to it. Inside them, the runtime's own
phases are named (``params.phases_ms_<size>mb``, from ``Manager.step_phases``, medians):
``boundary`` (closing the last step, in ``zero_grad``), ``quorum`` (the wait for the quorum
left after forward, which it overlaps; within a standing quorum, most steps ask nothing:
lighthouse/rules/standing.py), ``plan`` (applying it, at the first bucket),
``allreduce`` (waits on gradient buckets at the end of backward; DDP waits too, so only its
excess is overhead), ``flag`` (the "ok" flag's exchange) and ``vote`` (the group's decision:
within the commit lease its quorum granted, no question to the lighthouse; past it, the
lighthouse's fence, which a group of one asks from the training thread) in ``step``. ``events`` is the price of the
event log with a state digest every step: a third run with both on
(``step_time_events_<size>mb``) against the run with both off.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import tempfile
import time

from benchmarks.processes import ChildProcesses
from benchmarks.results import BenchmarkResult

RUNS = {10: (5, 200), 100: (3, 100)}
"""Per model size in MB: alternating runs a side, and timed steps a run."""
SEGMENTS = ("zero_grad", "forward", "backward", "step")
PHASES = ("quorum", "plan", "flag", "vote", "boundary", "allreduce", "total")
RUN_TIMEOUT_S = 300.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _one_run(
    mode: str,
    size_mb: float,
    steps: int,
    *,
    events_dir: str | None = None,
    world: int = 2,
    worker_args: tuple[str, ...] = (),
) -> tuple[float, dict[str, float]]:
    """The slower trainer's median step and that trainer's mean segments (``segment_<name>``)
    and, for replicaft, median phases.

    ``world`` trainers (replicaft: one replica group each); ``worker_args`` go to every
    step_worker (``--device``, ``--batch``: ``python -m benchmarks gpu``)."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    async with ChildProcesses() as children:
        extra: list[str] = []
        if mode == "replicaft":
            lighthouse = await children.start_python(
                "lighthouse", "-m", "lighthouse", "--port", "0", "--log-level", "WARNING"
            )
            address = (await lighthouse.expect_line("lighthouse serving gRPC at ", deadline)).strip()
            extra = ["--lighthouse", address, *(["--events-dir", events_dir] if events_dir else [])]
        else:
            extra = ["--store", f"127.0.0.1:{_free_port()}"]
        workers = [
            await children.start_python(
                f"{mode}-{rank}",
                "-m",
                "benchmarks.step_worker",
                "--mode",
                mode,
                "--rank",
                str(rank),
                "--world",
                str(world),
                "--size-mb",
                str(size_mb),
                "--steps",
                str(steps),
                *extra,
                *worker_args,
            )
            for rank in range(world)
        ]
        medians = []
        for w in workers:
            done = await w.expect_event("done", deadline)
            detail = {name: statistics.median(took) for name, took in done["phases_s"].items()}
            detail.update({f"segment_{name}": statistics.mean(took) for name, took in done["segments_s"].items()})
            medians.append((statistics.median(done["step_s"]), detail))
        return max(medians, key=lambda m: m[0])


def run(*, quick: bool) -> BenchmarkResult:
    figures: dict[str, float] = {}
    baselines: dict[str, float] = {}
    compared: dict[str, str] = {}
    runs = {size: (1, 8) if quick else counts for size, counts in RUNS.items()}
    params: dict[str, object] = {"runs_and_steps": {f"{size}mb": list(counts) for size, counts in runs.items()}}
    notes = ["milliseconds per step, median; 2 trainer processes on both sides; replicaft adds a lighthouse process"]
    for size, (repeats, steps) in runs.items():
        ours, theirs, logged = [], [], []
        for repeat in range(repeats):
            for mode in ("ddp", "replicaft") if repeat % 2 == 0 else ("replicaft", "ddp"):
                (theirs if mode == "ddp" else ours).append(asyncio.run(_one_run(mode, size, steps)))
            with tempfile.TemporaryDirectory(prefix="step-overhead-events-") as events_dir:
                logged.append(asyncio.run(_one_run("replicaft", size, steps, events_dir=events_dir)))
        params[f"runs_ms_{size}mb"] = [
            [round(d * 1000, 3), round(o * 1000, 3)] for (d, _), (o, _) in zip(theirs, ours, strict=True)
        ]
        ours_ms = statistics.median(t for t, _ in ours) * 1000
        figures[f"step_time_{size}mb"] = ours_ms
        figures[f"step_time_events_{size}mb"] = statistics.median(t for t, _ in logged) * 1000
        baselines[f"ddp_step_time_{size}mb"] = statistics.median(t for t, _ in theirs) * 1000
        compared[f"step_time_{size}mb"] = compared[f"step_time_events_{size}mb"] = f"ddp_step_time_{size}mb"
        phases = {name: round(statistics.median(p.get(name, 0.0) for _, p in ours) * 1000, 3) for name in PHASES}
        phases["events"] = round(figures[f"step_time_events_{size}mb"] - ours_ms, 3)
        params[f"phases_ms_{size}mb"] = phases
        gap = _gap_by_segment(ours, theirs)
        params[f"gap_ms_{size}mb"] = gap
        notes.append(f"{size} MB: {_explain(gap, phases)}")
    return BenchmarkResult(
        name="step_overhead",
        figures=figures,
        baselines=baselines,
        compared_to=compared,
        notes="; ".join(notes),
        params=params,
    )


def _gap_by_segment(
    ours: list[tuple[float, dict[str, float]]], theirs: list[tuple[float, dict[str, float]]]
) -> dict[str, float]:
    """Mean step time of each side over its runs, and each segment's gap (ours - DDP's), in ms;
    the segments' gaps add up to ``mean_gap``."""

    def mean_of(runs: list[tuple[float, dict[str, float]]], key: str) -> float:
        return statistics.mean(d[key] for _, d in runs) * 1000

    gap = {name: round(mean_of(ours, f"segment_{name}") - mean_of(theirs, f"segment_{name}"), 3) for name in SEGMENTS}
    gap["mean_step"] = round(sum(mean_of(ours, f"segment_{name}") for name in SEGMENTS), 3)
    gap["ddp_mean_step"] = round(sum(mean_of(theirs, f"segment_{name}") for name in SEGMENTS), 3)
    gap["mean_gap"] = round(gap["mean_step"] - gap["ddp_mean_step"], 3)
    return gap


def _explain(gap: dict[str, float], phases: dict[str, float]) -> str:
    """The gap named piece by piece: each segment's share, with the runtime's phases inside it."""
    step_rest = gap["step"] - phases["flag"] - phases["vote"]
    return (
        f"mean step {gap['mean_step']:.2f} vs DDP {gap['ddp_mean_step']:.2f}, gap {gap['mean_gap']:.2f} ms = "
        f"zero_grad {gap['zero_grad']:+.2f} (boundary {phases['boundary']:.2f}, asking the quorum) "
        f"+ forward {gap['forward']:+.2f} (the quorum forms meanwhile; wait left {phases['quorum']:.2f}) "
        f"+ backward {gap['backward']:+.2f} (plan {phases['plan']:.2f}; bucket waits {phases['allreduce']:.2f}) "
        f"+ step {gap['step']:+.2f} (flag {phases['flag']:.2f}, vote {phases['vote']:.2f}, "
        f"rest {step_rest:+.2f}); events and digest {phases['events']:+.2f}"
    )
