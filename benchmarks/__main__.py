"""``python -m benchmarks {<name>,all,list,summary} [--quick]``: run and record benchmarks.

The registry maps each benchmark's name to its module, imported only when that benchmark
runs, so listing benchmarks or rebuilding the summary never imports grpc or torch.
``--quick`` trades samples for time (each benchmark under a minute) and is recorded in the
result's params, since it writes the same results file as a full run.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import sys
import textwrap
import traceback
from pathlib import Path

from benchmarks.results import (
    RESULTS_DIR,
    BenchmarkUnavailable,
    format_table,
    machine_info,
    now_utc,
    write_result,
    write_summary,
)

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
    "lighthouse_ha": "benchmarks.lighthouse_ha",
    "ray_restart": "benchmarks.ray_restart",
    "recovery": "benchmarks.recovery",
    "slurm_restart": "benchmarks.slurm_restart",
    "step_overhead": "benchmarks.step_overhead",
    "torchft_suite": "benchmarks.torchft_suite",
}
"""name -> module exposing ``run(*, quick: bool) -> BenchmarkResult``."""

COMMANDS = ("all", "list", "summary")


def run_one(name: str, *, quick: bool, results_dir: Path) -> Path:
    """Run one benchmark, write its record, print its table; returns the results file."""
    module = importlib.import_module(BENCHMARKS[name])
    when, machine = now_utc(), machine_info()
    result = module.run(quick=quick)
    machine["load_average_end"] = machine_info()["load_average"]
    record = result.to_record(when=when, machine=machine)
    path = write_result(record, results_dir)
    print(f"\n== {name}{' (--quick)' if quick else ''}: {path}")
    print(format_table(record))
    if record.get("notes"):
        print(textwrap.fill(record["notes"], width=100))
    return path


def _describe(name: str) -> str:
    """The first docstring line of a benchmark module, without importing it (grpc, torch)."""
    spec = importlib.util.find_spec(BENCHMARKS[name])
    if spec is None or spec.origin is None:
        return ""
    doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text())) or ""
    return doc.splitlines()[0] if doc else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument("target", choices=[*BENCHMARKS, *COMMANDS],
                   help="a benchmark name, 'all', 'list', or 'summary' (rebuild SUMMARY.md only)")
    p.add_argument("--quick", action="store_true", help="fewer samples; each benchmark under a minute")
    p.add_argument("--results-dir", type=Path, default=RESULTS_DIR,
                   help="where <name>.json and SUMMARY.md go (default: %(default)s)")
    args = p.parse_args(argv)

    if args.target == "list":
        width = max(map(len, BENCHMARKS))
        for name in BENCHMARKS:
            print(f"{name:{width}}  {_describe(name)}")
        return 0
    failed, unavailable = [], []
    if args.target != "summary":
        for name in list(BENCHMARKS) if args.target == "all" else [args.target]:
            try:
                run_one(name, quick=args.quick, results_dir=args.results_dir)
            except BenchmarkUnavailable as e:
                print(f"benchmark {name!r} cannot run here: {e}; its results file was not updated", file=sys.stderr)
                unavailable.append(name)
            except Exception:
                traceback.print_exc()
                print(f"benchmark {name!r} failed; its results file was not updated", file=sys.stderr)
                failed.append(name)
    print(f"summary: {write_summary(args.results_dir)}")
    # ``all`` on a machine without a GPU is a success; asking for the one benchmark it cannot run is not.
    return 1 if failed or (unavailable and args.target != "all") else 0


if __name__ == "__main__":
    sys.exit(main())
