"""One chaos experiment: the faulted run (after a fault-free reference run, if asked) and its outputs.

Writes ``summary.json`` and ``report.html`` into the output directory, next to the run's
``events/`` and ``logs/``. The reference run is optional because it doubles the time; without
it ``goodput_vs_fault_free`` is null and the final-loss invariant is reported as not checked.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaos.report import render_report
from chaos.runner import Progress, Runner
from chaos.scenario import Scenario
from chaos.summary import Reference, build_summary, reference_from
from chaos.timeline import commits
from replicaft.telemetry.events import read_events_dir

logger = logging.getLogger(__name__)


def run_reference(
    scenario: Scenario, out_dir: Path, on_progress: Callable[[Progress], None] | None = None
) -> Reference:
    """Run ``scenario`` without its faults into ``out_dir`` and return its figures."""
    fault_free = dataclasses.replace(scenario, name=f"{scenario.name}-fault-free", faults=())
    logger.info("fault-free reference run into %s", out_dir)
    record = Runner(fault_free, out_dir, on_progress=on_progress).run()
    return reference_from(record, read_events_dir(record.events_dir))


def run_experiment(
    scenario: Scenario,
    out_dir: Path,
    *,
    reference: bool = False,
    on_progress: Callable[[Progress], None] | None = None,
) -> dict[str, Any]:
    """Run the scenario, check it, write ``summary.json`` and ``report.html``; returns the summary.

    Blocks for the run (bounded by the scenario's ``run_timeout_s``, twice with ``reference``).
    Raises RuntimeError when the lighthouse cannot be started at all.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    ref = run_reference(scenario, out_dir / "reference", on_progress) if reference else None
    record = Runner(scenario, out_dir, on_progress=on_progress).run()
    events = read_events_dir(record.events_dir)
    summary = build_summary(record, events, ref)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    page = render_report(summary, commits(events), record.faults, t0=record.started_ts, t_end=record.ended_ts)
    (out_dir / "report.html").write_text(page, encoding="utf-8")
    logger.info("wrote %s and %s", out_dir / "summary.json", out_dir / "report.html")
    return summary
