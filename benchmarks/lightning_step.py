"""Lightning step time: replicaft's ``FaultTolerantStrategy`` vs Lightning's own ``DDPStrategy``,
same LightningModule, same data, two trainer processes each.

Both sides train examples/train_lightning.py's ``Regression`` (an MLP with BatchNorm) on its
``RegressionData``, 32 samples per process a step, one intra-op thread per process so the two
share this machine's two cores alike. Lightning's side is ``DDPStrategy(process_group_backend=
"gloo")`` over two ranks; replicaft's is two replica groups of one process each plus a
lighthouse process, state digests off. A step is timed from ``on_train_batch_start`` to
``on_train_batch_end`` (benchmarks/lightning_worker.py), so it holds the data, forward,
backward, the all-reduce, the optimizer step and replicaft's quorum and vote; the figure is
the median over timed steps of the slower process. The sides alternate over several runs
(``params.runs_ms_<width>``) and the medians of the runs are compared, at the example's width
(64: a ~20 KB model, where a step is all per-step overhead) and at width 1024 (~4 MB).
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import time

from benchmarks.processes import ChildProcesses
from benchmarks.results import BenchmarkResult

RUNS = 3
STEPS = 200
WIDTHS = (64, 1024)
RUN_TIMEOUT_S = 300.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _one_run(mode: str, width: int, steps: int) -> float:
    """The slower process's median step, in seconds."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    async with ChildProcesses() as children:
        if mode == "replicaft":
            lighthouse = await children.start_python(
                "lighthouse", "-m", "lighthouse", "--port", "0", "--min-replicas", "2", "--log-level", "WARNING"
            )
            address = (await lighthouse.expect_line("lighthouse serving gRPC at ", deadline)).strip()
            extra = ["--lighthouse", address]
        else:
            extra = ["--master-port", str(_free_port())]
        workers = [
            await children.start_python(
                f"{mode}-{rank}",
                "-m",
                "benchmarks.lightning_worker",
                "--mode",
                mode,
                "--rank",
                str(rank),
                "--world",
                "2",
                "--steps",
                str(steps),
                "--width",
                str(width),
                *extra,
            )  # fmt: skip
            for rank in range(2)
        ]
        medians = [statistics.median((await w.expect_event("done", deadline))["step_s"]) for w in workers]
        return max(medians)


def run(*, quick: bool) -> BenchmarkResult:
    runs, steps = (1, 30) if quick else (RUNS, STEPS)
    figures: dict[str, float] = {}
    baselines: dict[str, float] = {}
    compared: dict[str, str] = {}
    params: dict[str, object] = {"runs": runs, "timed_steps": steps, "samples_per_process": 32}
    for width in WIDTHS:
        ours, theirs = [], []
        for repeat in range(runs):
            for mode in ("ddp", "replicaft") if repeat % 2 == 0 else ("replicaft", "ddp"):
                (theirs if mode == "ddp" else ours).append(asyncio.run(_one_run(mode, width, steps)) * 1000)
        params[f"runs_ms_{width}"] = [[round(d, 3), round(o, 3)] for d, o in zip(theirs, ours, strict=True)]
        figures[f"step_ms_width{width}"] = statistics.median(ours)
        baselines[f"lightning_ddp_step_ms_width{width}"] = statistics.median(theirs)
        compared[f"step_ms_width{width}"] = f"lightning_ddp_step_ms_width{width}"
    return BenchmarkResult(
        name="lightning_step",
        figures=figures,
        baselines=baselines,
        compared_to=compared,
        notes=(
            "milliseconds per Lightning training step, median of the slower of 2 processes; Lightning's "
            "DDPStrategy (Gloo) vs FaultTolerantStrategy (2 replica groups + a lighthouse), alternating runs"
        ),
        params=params,
    )
