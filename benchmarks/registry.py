"""Which benchmarks exist, and what each measures, read without importing any of them."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

BENCHMARKS: dict[str, str] = {
    "failover": "benchmarks.failover",
    "checkpoint": "benchmarks.checkpoint",
    "checkpoint_storage": "benchmarks.checkpoint_storage",
    "deterministic": "benchmarks.deterministic",
    "diloco": "benchmarks.diloco",
    "diloco_wire": "benchmarks.diloco_wire",
    "gpu": "benchmarks.gpu",
    "heal": "benchmarks.heal",
    "lighthouse": "benchmarks.lighthouse",
    "lightning_step": "benchmarks.lightning_step",
    "lighthouse_ha": "benchmarks.lighthouse_ha",
    "ray_restart": "benchmarks.ray_restart",
    "recovery": "benchmarks.recovery",
    "slurm_restart": "benchmarks.slurm_restart",
    "step_overhead": "benchmarks.step_overhead",
    "scale": "benchmarks.scale.benchmark",
    "torchft_suite": "benchmarks.torchft_suite",
}
"""name -> module exposing ``run(*, quick: bool) -> BenchmarkResult``."""


def describe(name: str) -> str:
    """The first paragraph of a benchmark module's docstring, without importing it (grpc,
    torch): what ``list`` prints a line of and the docs site's figures page shows."""
    spec = importlib.util.find_spec(BENCHMARKS[name])
    if spec is None or spec.origin is None:
        return ""
    doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text())) or ""
    return " ".join(doc.split("\n\n")[0].split())
