"""``python -m benchmarks {<name>,all,list,summary} [--quick]``: run and record benchmarks.

The registry maps each benchmark's name to its module, imported only when that benchmark
runs, so listing benchmarks or printing the summary never imports grpc or torch.
``--quick`` trades samples for time (each benchmark under a minute) and is recorded in the
result's params, since it writes the same results file as a full run.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
import traceback
from pathlib import Path

from benchmarks.registry import BENCHMARKS, describe
from benchmarks.results import (
    RESULTS_DIR,
    BenchmarkUnavailable,
    format_table,
    machine_info,
    now_utc,
    read_records,
    summary_table,
    write_result,
)

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument(
        "target",
        choices=[*BENCHMARKS, *COMMANDS],
        help="a benchmark name, 'all', 'list', or 'summary' (print every recorded figure)",
    )
    p.add_argument("--quick", action="store_true", help="fewer samples; each benchmark under a minute")
    p.add_argument(
        "--results-dir", type=Path, default=RESULTS_DIR, help="where <name>.json goes (default: %(default)s)"
    )
    args = p.parse_args(argv)

    if args.target == "list":
        width = max(map(len, BENCHMARKS))
        for name in BENCHMARKS:
            print(f"{name:{width}}  {textwrap.shorten(describe(name), 110)}")
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
    if args.target == "summary":
        print("\n".join(summary_table(read_records(args.results_dir))))
    # ``all`` on a machine without a GPU is a success; asking for the one benchmark it cannot run is not.
    return 1 if failed or (unavailable and args.target != "all") else 0


if __name__ == "__main__":
    sys.exit(main())
