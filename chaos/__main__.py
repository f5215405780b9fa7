"""``python -m chaos`` / ``replicaft-chaos``: run failure-injection scenarios against replicaft.

    python -m chaos run smoke --out runs/smoke      # a shipped scenario, or a path to a .toml
    python -m chaos run every_fault --out runs/ef   # one fault of every kind (root: namespaces, tmpfs)
    python -m chaos demo                            # the README demo into ./runs/demo-<timestamp>

Shipped scenarios (chaos/scenarios/): smoke, demo, every_fault, every_fault_w2, catastrophe,
partition, soak, gpt (examples/train_gpt.py), standby (restarts in warm standbys, as
replicaft-launch does them), stateful_data (a torchdata StatefulDataLoader with workers over a
Hugging Face dataset). The fault kinds are documented in chaos/scenario.py.

Exit code: 0 when every checked invariant held, 1 when there are violations, 2 when the
scenario is invalid or the run could not start. Logging is configured here and nowhere else.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from chaos.experiment import run_experiment
from chaos.runner import Progress
from chaos.scenario import SCENARIO_DIR, ScenarioError, load_scenario


class ProgressLine:
    """Prints the live progress line: rewritten in place on a terminal, a line per change elsewhere.

    Off a terminal (CI logs, pipes) a line is printed when the step moves by 5, a fault is
    injected or the quorum changes, and at least every 5 s, so logs stay readable.
    """

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._tty = out.isatty()
        self._last: tuple[int, int, int] | None = None
        self._last_printed = 0.0

    def __call__(self, p: Progress) -> None:
        text = (
            f"[{p.elapsed_s:6.1f}s] step {p.step:>4}/{p.target_steps}  quorum {p.quorum_size}  "
            f"groups running {p.groups_running}  faults {p.faults_injected}/{p.faults_planned}"
        )
        if self._tty:
            self._out.write("\r" + text + "   ")
            self._out.flush()
            return
        key = (p.step // 5, p.faults_injected, p.quorum_size)
        now = time.monotonic()
        if key != self._last or now - self._last_printed >= 5.0:
            self._last, self._last_printed = key, now
            print(text, file=self._out, flush=True)

    def end(self) -> None:
        if self._tty:
            self._out.write("\n")
            self._out.flush()


def _seconds(figures: dict[str, dict[str, float]]) -> str:
    return "; ".join(f"{k} median {v['median']:.2f} max {v['max']:.2f}" for k, v in figures.items()) or "-"


def format_summary(summary: dict[str, Any], report: Path) -> str:
    """The human-readable table printed at the end of a run."""
    ratio = summary["goodput_vs_fault_free"]
    rows = [
        ("scenario", summary["scenario"]),
        ("committed steps", f"{summary['committed_steps']} / {summary['target_steps']}"),
        ("wall seconds", f"{summary['wall_seconds']:.1f}"),
        ("faults injected", " ".join(f"{k}={v}" for k, v in summary["faults_injected"].items()) or "none"),
        ("faults skipped", str(len(summary["faults_skipped"]))),
        *((f"  {x['fault']}", x["reason"]) for x in summary["faults_skipped"]),
        ("goodput", f"{summary['goodput']}" + (f" ({ratio:.2f}x fault-free)" if ratio is not None else "")),
        ("vs fault-free", summary["goodput_vs_fault_free_note"]),
        ("recovery s", _seconds(summary["recovery_seconds"])),
        ("rejoin s", _seconds(summary["rejoin_seconds"])),
        ("hangs", str(summary["hangs"])),
    ]
    rows += [(f"  {v['invariant']}", f"{v['status'].replace('_', ' ')}: {v['note']}") for v in summary["invariants"]]
    rows.append(("violations", str(len(summary["violations"]))))
    rows += [
        (f"  {v['invariant']}", f"step {v['step']} group {v['group']}: {v['detail']}") for v in summary["violations"]
    ]
    rows.append(("report", str(report)))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="replicaft-chaos", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one scenario and check the invariants")
    shipped = ", ".join(sorted(p.stem for p in SCENARIO_DIR.glob("*.toml")))
    run.add_argument("scenario", help=f"a shipped scenario name ({shipped}) or a path to a .toml file")
    run.add_argument(
        "--out", required=True, type=Path, help="directory for summary.json, report.html, events/ and logs/"
    )
    demo = sub.add_parser("demo", help="run the README demo into ./runs/demo-<timestamp>")
    demo.add_argument("--out", type=Path, default=None, help="output directory (default: ./runs/demo-<timestamp>)")
    for sp in (run, demo):
        sp.add_argument(
            "--reference",
            action="store_true",
            help="first run the scenario without faults, to compare goodput (doubles the time)",
        )
        sp.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Turn SIGTERM into SystemExit so the runner's ``finally`` stops every child it started.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    name = "demo" if args.command == "demo" else args.scenario
    out = args.out
    if out is None:
        out = Path("runs") / f"demo-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    try:
        scenario = load_scenario(name)
    except ScenarioError as e:
        print(f"replicaft-chaos: error: {e}", file=sys.stderr)
        return 2
    print(
        f"running scenario {scenario.name!r} ({len(scenario.faults)} faults, {scenario.groups} groups, "
        f"{scenario.steps} steps) into {out}",
        flush=True,
    )
    if args.reference:
        print(f"first a fault-free reference run into {out / 'reference'}, then the run with faults", flush=True)
    progress = ProgressLine(sys.stdout)
    try:
        summary = run_experiment(scenario, out, reference=args.reference, on_progress=progress)
    except RuntimeError as e:
        progress.end()
        print(f"replicaft-chaos: error: the run could not start: {e}", file=sys.stderr)
        return 2
    progress.end()
    print(format_summary(summary, out / "report.html"))
    return 0 if not summary["violations"] else 1


if __name__ == "__main__":
    sys.exit(main())
