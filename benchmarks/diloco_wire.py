"""What a reduced-precision pseudo-gradient costs in loss: fp32, bf16 and packed int8 on the wire.

Three groups of ``examples/train_diloco.py`` on loopback (the link does not matter here: the
question is the loss, not the time), the same seeds, data leases and number of syncs for each
wire format, so the runs differ only in how the pseudo-gradient travels. Figures: the held-out
loss after the last sync, compared with fp32's from the same run, and the bytes each format
puts on the wire per value (``replicaft/local_sgd/wire.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.results import BenchmarkResult
from replicaft.local_sgd.wire import BYTES_PER_VALUE

REPO = Path(__file__).resolve().parent.parent
MODEL = ("--layers", "4", "--heads", "4", "--d-model", "256", "--context", "64", "--batch-size", "4", "--threads", "1")


def run_wire(wire: str, syncs: int, tmp: Path) -> float:
    """The mean held-out loss of the three groups after ``syncs`` syncs with ``wire``."""
    lh = subprocess.Popen(
        [sys.executable, "-m", "lighthouse", "--port", "0", "--join-timeout", "30"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert lh.stdout is not None
        address = next(line.split()[-1] for line in lh.stdout if "serving gRPC at" in line)
        env = dict(os.environ, PYTHONPATH=str(REPO), REPLICAFT_LIGHTHOUSE=address)
        groups = [
            subprocess.Popen(
                [
                    sys.executable,
                    "examples/train_diloco.py",
                    "--syncs",
                    str(syncs),
                    "--sync-every",
                    "20",
                    "--wire",
                    wire,
                    *MODEL,
                ],
                cwd=REPO,
                env=dict(env, REPLICAFT_REPLICA_ID=f"g{i}"),
                stdout=subprocess.PIPE,
                stderr=(tmp / f"{wire}-g{i}.stderr").open("w"),
                text=True,
            )
            for i in range(3)
        ]
        finals = []
        for g in groups:
            out, _ = g.communicate(timeout=1800)
            finals += [json.loads(line) for line in out.splitlines() if line.startswith('{"event": "final"')]
        if len(finals) != 3:
            raise RuntimeError(f"wire={wire}: {len(finals)} of 3 groups finished; see {tmp}")
        return sum(f["held_out_loss"] for f in finals) / 3
    finally:
        lh.kill()
        lh.wait(10)


def run(*, quick: bool) -> BenchmarkResult:
    syncs = 5 if quick else 20
    with tempfile.TemporaryDirectory(prefix="replicaft-wire-") as tmp:
        loss = {wire: run_wire(wire, syncs, Path(tmp)) for wire in ("fp32", "bf16", "int8")}
    return BenchmarkResult(
        name="diloco_wire",
        figures={
            "bf16_held_out_loss": loss["bf16"],
            "int8_held_out_loss": loss["int8"],
            "bf16_wire_bytes_per_value": BYTES_PER_VALUE["bf16"],
            "int8_wire_bytes_per_value": BYTES_PER_VALUE["int8"],
        },
        baselines={"fp32_held_out_loss": loss["fp32"], "fp32_wire_bytes_per_value": BYTES_PER_VALUE["fp32"]},
        compared_to={
            "bf16_held_out_loss": "fp32_held_out_loss",
            "int8_held_out_loss": "fp32_held_out_loss",
            "bf16_wire_bytes_per_value": "fp32_wire_bytes_per_value",
            "int8_wire_bytes_per_value": "fp32_wire_bytes_per_value",
        },
        notes=(
            "3 groups of the GPT example (4 layers, d_model 256, context 64, 4 windows per inner step), DiLoCo H = "
            f"20, {syncs} syncs per wire format on loopback, same seeds and leases; held-out loss (32 windows) after "
            "the last sync, mean of the groups. int8: codes in [0, 2*(127//N)] against a per-4096-value scale "
            "shared by all groups, three per float32 word."
        ),
        params={"syncs": syncs, "sync_every": 20},
    )
