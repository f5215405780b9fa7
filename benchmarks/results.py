"""The benchmark result record: what a run measured, against what, on which machine.

A figure means little without a reference measured next to it: this machine is shared and
noisy, so an absolute millisecond count from one run is not comparable with another run's.
Every benchmark therefore measures its baselines in the same run, and the record keeps the
figure, the baseline and their ratio side by side. The ratio is the number to compare across
machines and days; the absolute figures are kept to compare against targets.

The JSON layout is a convention other tools rely on (DESIGN.md, "Conventions"):
``{"name", "when", "machine", "figures", "baselines", "ratios"}`` plus optional ``"notes"``
and ``"params"``, one file per benchmark in ``benchmarks/results/<name>.json``.
``SUMMARY.md`` beside them is regenerated from those files, never edited by hand, so the
README can embed it without drifting from the measurements.
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
SUMMARY_NAME = "SUMMARY.md"
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
        rows.append((
            figure,
            _number(value),
            f"{baseline} = {_number(record['baselines'][baseline])}" if baseline else "",
            f"{record['ratios'][figure]:.2f}x" if figure in record["ratios"] else "",
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _baseline_of(record: Mapping[str, Any]) -> dict[str, str]:
    return dict(record.get("params", {}).get(COMPARED_TO_PARAM, {}))


def _number(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def write_summary(results_dir: Path = RESULTS_DIR) -> Path:
    """Regenerate ``SUMMARY.md`` from every ``*.json`` result in ``results_dir``.

    One markdown table row per figure, then one line per benchmark saying when and where it
    ran and how it measured; the README embeds this file.
    """
    records = [json.loads(p.read_text()) for p in sorted(results_dir.glob("*.json"))]
    lines = [
        "<!-- generated by `python -m benchmarks summary` from benchmarks/results/*.json; do not edit -->",
        "",
        "| benchmark | figure | value | baseline (same run) | ratio |",
        "|---|---|---:|---|---:|",
    ]
    for record in records:
        baseline_of = _baseline_of(record)
        for figure, value in record["figures"].items():
            baseline = baseline_of.get(figure)
            lines.append(
                f"| {record['name']} | `{figure}` | {_number(value)} | "
                + (f"`{baseline}` = {_number(record['baselines'][baseline])}" if baseline else "")
                + " | "
                + (f"{record['ratios'][figure]:.2f}x" if figure in record["ratios"] else "")
                + " |"
            )
    lines.append("")
    for record in records:
        m = record["machine"]
        quick = " (--quick)" if record.get("params", {}).get("quick") else ""
        where = (
            f"{m.get('cpu_count')} CPUs ({m.get('cpu_model') or 'unknown model'}), "
            f"Python {m.get('python')}, load average {m.get('load_average')}"
        )
        line = f"- **{record['name']}**{quick}, {record['when']}, {where}."
        if record.get("notes"):
            line += f" {record['notes']}"
        lines.append(line)
    path = results_dir / SUMMARY_NAME
    results_dir.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    if results_dir == RESULTS_DIR:
        embed_in_readme(lines[2 : lines.index("", 2)])
    return path


README = RESULTS_DIR.parent.parent / "README.md"
README_BEGIN = "<!-- benchmarks:begin (generated by `python -m benchmarks summary`; do not edit) -->"
README_END = "<!-- benchmarks:end -->"


def embed_in_readme(table: list[str], readme: Path = README) -> bool:
    """Replace the README's benchmark table (between the markers) with ``table``; False if the
    README has no markers, so a copy of the package outside the repository changes nothing."""
    if not readme.exists():
        return False
    text = readme.read_text()
    begin, end = text.find(README_BEGIN), text.find(README_END)
    if begin < 0 or end < begin:
        return False
    readme.write_text(text[: begin + len(README_BEGIN)] + "\n\n" + "\n".join(table) + "\n\n" + text[end:])
    return True
