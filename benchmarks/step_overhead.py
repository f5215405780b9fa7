"""Step overhead: replicaft's fault-tolerant step vs plain torch DDP, same processes, same model.

Both sides run two trainer processes (Gloo on CPU, one intra-op thread each, so the two
processes share this machine's two cores the same way) training the same stack of
1024x1024 linear layers with SGD on a fixed batch. Plain DDP is
``torch.nn.parallel.DistributedDataParallel`` over ``init_process_group("gloo")``; replicaft
is two replica groups of one rank each (``replicaft.DistributedDataParallel`` +
``replicaft.Optimizer``) plus a lighthouse process, state digests off. A step is timed from
``zero_grad`` to the end of ``step`` (so replicaft's quorum, vote and fence are inside it);
the figure is the median over timed steps of the slower of the two trainers. DDP and
replicaft runs alternate, twice each per size, and the medians of those runs are compared.

The fixed cost a step pays is named piece by piece (``params.phases_ms_<size>mb``, medians
over the same steps, from ``Manager.step_phases``): ``quorum`` (the wait for the quorum left
after forward, which it overlaps), ``plan`` (applying it), ``flag`` (the "ok" flag all-reduce),
``vote`` (the group's vote with the lighthouse's fence), ``boundary`` (closing the last step).
``events`` is the price of the event log with a state digest every step: a third run with both
on (``step_time_events_<size>mb``) against the run with both off.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import tempfile
import time

from benchmarks.processes import ChildProcesses
from benchmarks.results import BenchmarkResult

SIZES_MB = (10, 100)
RUN_TIMEOUT_S = 300.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _one_run(mode: str, size_mb: float, steps: int, *, events_dir: str | None = None, world: int = 2,
                   worker_args: tuple[str, ...] = ()) -> tuple[float, dict[str, float]]:
    """The slower trainer's median step and, for replicaft, that trainer's median phases.

    ``world`` trainers (replicaft: one replica group each); ``worker_args`` go to every
    step_worker (``--device``, ``--batch``: ``python -m benchmarks gpu``)."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    async with ChildProcesses() as children:
        extra: list[str] = []
        if mode == "replicaft":
            lighthouse = await children.start_python("lighthouse", "-m", "lighthouse", "--port", "0", "--log-level", "WARNING")
            address = (await lighthouse.expect_line("lighthouse serving gRPC at ", deadline)).strip()
            extra = ["--lighthouse", address, *(["--events-dir", events_dir] if events_dir else [])]
        else:
            extra = ["--store", f"127.0.0.1:{_free_port()}"]
        workers = [
            await children.start_python(
                f"{mode}-{rank}", "-m", "benchmarks.step_worker", "--mode", mode, "--rank", str(rank), "--world",
                str(world), "--size-mb", str(size_mb), "--steps", str(steps), *extra, *worker_args,
            )
            for rank in range(world)
        ]
        medians = []
        for w in workers:
            done = await w.expect_event("done", deadline)
            phases = {name: statistics.median(took) for name, took in done["phases_s"].items()}
            medians.append((statistics.median(done["step_s"]), phases))
        return max(medians, key=lambda m: m[0])


def run(*, quick: bool) -> BenchmarkResult:
    steps = 8 if quick else 25
    repeats = 1 if quick else 2
    figures: dict[str, float] = {}
    baselines: dict[str, float] = {}
    compared: dict[str, str] = {}
    params: dict[str, object] = {"steps": steps, "repeats": repeats, "sizes_mb": list(SIZES_MB)}
    notes = ["milliseconds per step, median; 2 trainer processes on both sides; replicaft adds a lighthouse process"]
    for size in SIZES_MB:
        ours, theirs, logged = [], [], []
        for _ in range(repeats):
            theirs.append(asyncio.run(_one_run("ddp", size, steps)))
            ours.append(asyncio.run(_one_run("replicaft", size, steps)))
            with tempfile.TemporaryDirectory(prefix="step-overhead-events-") as events_dir:
                logged.append(asyncio.run(_one_run("replicaft", size, steps, events_dir=events_dir)))
        ours_ms = statistics.median(t for t, _ in ours) * 1000
        figures[f"step_time_{size}mb"] = ours_ms
        figures[f"step_time_events_{size}mb"] = statistics.median(t for t, _ in logged) * 1000
        baselines[f"ddp_step_time_{size}mb"] = statistics.median(t for t, _ in theirs) * 1000
        compared[f"step_time_{size}mb"] = compared[f"step_time_events_{size}mb"] = f"ddp_step_time_{size}mb"
        phases = {name: round(statistics.median(p.get(name, 0.0) for _, p in ours) * 1000, 3)
                  for name in ("quorum", "plan", "flag", "vote", "boundary", "allreduce", "total")}
        phases["events"] = round(figures[f"step_time_events_{size}mb"] - ours_ms, 3)
        params[f"phases_ms_{size}mb"] = phases
        fixed = ", ".join(f"{name} {phases[name]:.2f}" for name in ("quorum", "plan", "flag", "vote", "boundary", "events"))
        notes.append(f"{size} MB fixed costs (ms): {fixed}")
    return BenchmarkResult(
        name="step_overhead",
        figures=figures,
        baselines=baselines,
        compared_to=compared,
        notes="; ".join(notes),
        params=params,
    )
