"""The benchmark result record: what a run measured, against what, on which machine.

A figure means little without a reference measured next to it: this machine is shared and
noisy, so an absolute millisecond count from one run is not comparable with another run's.
Every benchmark therefore measures its baselines in the same run, and the record keeps the
figure, the baseline and their ratio side by side. The ratio is the number to compare across
machines and days; the absolute figures are kept to compare against targets.

The JSON layout is a convention other tools rely on (DESIGN.md, "Conventions"):
``{"name", "when", "machine", "figures", "baselines", "ratios"}`` plus optional ``"notes"``
and ``"params"``, one file per benchmark in ``benchmarks/results/<name>.json``.
The docs site's figures page (``docs/benchmarks.md``) is built from those files at every
docs build (:func:`results_page`), never edited by hand.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
COMPARED_TO_PARAM = "compared_to"
"""Which baseline each ratio divides by, kept under ``params`` (the top-level keys are fixed)."""
DECIMALS = 4
"""Figures are milliseconds or counts; 0.1 µs is far below this machine's noise."""


class BenchmarkUnavailable(RuntimeError):
    """This machine cannot run the benchmark (no GPU for ``gpu``): it measured nothing.

    Raised by a benchmark's ``run`` before it measures anything. The runner then writes no
    record, so a real result measured elsewhere (``gpu.json`` from a GPU machine) is not
    overwritten by a figure-less one, and says why instead of printing a traceback."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BenchmarkResult:
    """What one benchmark returns; the runner adds the time and the machine and writes it."""

    name: str
    figures: Mapping[str, float]
    """Our measurements, the unit in the name (``quorum_ms_p50_8``)."""
    baselines: Mapping[str, float]
    """References measured in the same run (``grpc_echo_ms_p50``)."""
    compared_to: Mapping[str, str] = field(default_factory=dict)
    """figure -> the baseline it is divided by; figures without a fair baseline are absent."""
    notes: str = ""
    """How the figures were measured, in a sentence or three: what a reader must know to
    interpret them (process layout, what the clock brackets)."""
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for figure, baseline in self.compared_to.items():
            if figure not in self.figures:
                raise ValueError(f"{self.name}: ratio asked for figure {figure!r}, which was not measured")
            if baseline not in self.baselines:
                raise ValueError(
                    f"{self.name}: figure {figure!r} is compared to baseline {baseline!r}, which "
                    f"was not measured (baselines: {sorted(self.baselines)})"
                )
            if self.baselines[baseline] <= 0:
                raise ValueError(
                    f"{self.name}: baseline {baseline}={self.baselines[baseline]} cannot divide; "
                    "a baseline must be a positive measurement"
                )

    def ratios(self) -> dict[str, float]:
        """Each compared figure over its baseline, both from this run."""
        return {f: self.figures[f] / self.baselines[b] for f, b in self.compared_to.items()}

    def to_record(self, *, when: str, machine: Mapping[str, Any]) -> dict[str, Any]:
        record: dict[str, Any] = {
            "name": self.name,
            "when": when,
            "machine": dict(machine),
            "figures": _rounded(self.figures),
            "baselines": _rounded(self.baselines),
            "ratios": _rounded(self.ratios()),
        }
        if self.notes:
            record["notes"] = self.notes
        params = dict(self.params)
        if self.compared_to:
            params[COMPARED_TO_PARAM] = dict(self.compared_to)
        if params:
            record["params"] = params
        return record


def _rounded(values: Mapping[str, float]) -> dict[str, float]:
    return {k: round(float(v), DECIMALS) for k, v in values.items()}


def now_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def machine_info() -> dict[str, Any]:
    """Describe the machine a run used, so a reader can tell a slow result from a slow host.

    The load average is part of it because this machine is shared: a figure measured at
    load 3 on 2 cores says more about the neighbours than about us. The torch version is
    read from the installed metadata rather than by importing torch (seconds, and useless
    to the torch-free benchmarks).
    """
    try:
        torch_version: str | None = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = None
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "torch": torch_version,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def _cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return None


def write_result(record: Mapping[str, Any], results_dir: Path = RESULTS_DIR) -> Path:
    """Write one benchmark's record to ``<results_dir>/<name>.json``; returns the path."""
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{record['name']}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def format_table(record: Mapping[str, Any]) -> str:
    """The short table printed after a run: figure, value, baseline it is compared to, ratio."""
    baseline_of = _baseline_of(record)
    rows = [("figure", "value", "baseline", "ratio")]
    for figure, value in record["figures"].items():
        baseline = baseline_of.get(figure)
        rows.append(
            (
                figure,
                _number(value),
                f"{baseline} = {_number(record['baselines'][baseline])}" if baseline else "",
                f"{record['ratios'][figure]:.2f}x" if figure in record["ratios"] else "",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _baseline_of(record: Mapping[str, Any]) -> dict[str, str]:
    return dict(record.get("params", {}).get(COMPARED_TO_PARAM, {}))


def _number(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def read_records(results_dir: Path = RESULTS_DIR) -> list[dict[str, Any]]:
    """Every benchmark's latest record in ``results_dir``, by name."""
    return [json.loads(p.read_text()) for p in sorted(results_dir.glob("*.json"))]


def summary_table(records: list[Mapping[str, Any]]) -> list[str]:
    """One markdown table of every figure: benchmark, figure, value, baseline, ratio."""
    lines = ["| benchmark | figure | value | baseline (same run) | ratio |", "|---|---|---:|---|---:|"]
    for record in records:
        lines.extend(_rows(record, with_name=True))
    return lines


def results_page(records: list[Mapping[str, Any]], describe: Mapping[str, str]) -> list[str]:
    """The docs site's figures page (docs/benchmarks.md): a section per benchmark with what it
    measures (``describe``: its module's docstring), when and where it ran, every figure beside
    its baseline, and its notes. Built from the results files at every docs build, so running a
    benchmark never edits a page by hand."""
    lines: list[str] = []
    for record in records:
        m = record["machine"]
        quick = " with `--quick`" if record.get("params", {}).get("quick") else ""
        lines += [f"## {record['name']}", ""]
        if describe.get(record["name"]):
            lines += [describe[record["name"]], ""]
        lines += [
            f"Run{quick} at {record['when']} on {m.get('cpu_count')} CPUs ({m.get('cpu_model') or 'unknown model'}), "
            f"Python {m.get('python')}, torch {m.get('torch')}, load average {m.get('load_average')}; "
            f"`python -m benchmarks {record['name']}` rewrites `benchmarks/results/{record['name']}.json`.",
            "",
            "| figure | value | baseline (same run) | ratio |",
            "|---|---:|---|---:|",
            *_rows(record, with_name=False),
            "",
        ]
        if record.get("notes"):
            lines += [f"*How it was measured.* {record['notes']}", ""]
    return lines


def _rows(record: Mapping[str, Any], *, with_name: bool) -> list[str]:
    baseline_of = _baseline_of(record)
    rows = []
    for figure, value in record["figures"].items():
        baseline = baseline_of.get(figure)
        cells = [
            f"`{figure}`",
            _number(value),
            f"`{baseline}` = {_number(record['baselines'][baseline])}" if baseline else "",
            f"{record['ratios'][figure]:.2f}x" if figure in record["ratios"] else "",
        ]
        rows.append("| " + " | ".join(([record["name"]] if with_name else []) + cells) + " |")
    return rows
