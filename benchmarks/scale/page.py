"""The scale benchmark's results page: tables and inline SVG charts of what scale.json holds,
written beside it (benchmarks/results/scale.html) so a person can read the sweeps at a glance."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from benchmarks.results import BenchmarkResult
from benchmarks.scale.compare import SYSTEMS
from benchmarks.scale.svg import line_chart

STYLE = (
    "body{font-family:sans-serif;max-width:980px;margin:2em auto;line-height:1.4;color:#222}"
    "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
    "th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}code{background:#f6f6f6}"
)


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    head = "".join(f"<th>{escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(_cell(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 10 else f"{value:,.1f}"
    return str(value)


def _goodput_rows(rows: list[Mapping[str, Any]], first: str) -> list[list[Any]]:
    return [
        [row[first], row["gpus"], row["hours"], row["job_mtbf_h"], sum(row["runs"]["replicaft"]["faults"].values())]
        + [row["runs"][s]["goodput"] for s in SYSTEMS]
        + [row["checkpoint"]["closed_form_goodput"], row["checkpoint"]["interval_s"]]
        for row in rows
    ]


def _lost_rows(row: Mapping[str, Any]) -> list[list[Any]]:
    kinds = sorted({k for s in SYSTEMS for k in row["runs"][s]["faults"]})
    return [
        [kind, row["runs"]["replicaft"]["faults"].get(kind, 0)]
        + [row["runs"][s]["lost_job_s_per_fault"].get(kind, 0.0) for s in SYSTEMS]
        + [row["runs"][s]["lost_group_s_per_fault"].get(kind, 0.0) for s in SYSTEMS[:2]]
        for kind in kinds
    ]


def _sizes(row: Mapping[str, Any]) -> list[list[Any]]:
    return [
        [s, q["mean"], q["min"], q["full_share"], q["changes"]]
        for s in SYSTEMS[:2]
        for q in [row["runs"][s]["quorum_sizes"]]
    ]


def write_page(result: BenchmarkResult, path: Path) -> Path:
    p = result.params
    by_groups, by_rate, problem = p["by_groups"], p["by_rate"], p["left_out"]
    largest = by_groups[-1]
    goodput_header = [
        "",
        "GPUs",
        "hours simulated",
        "job MTBF h",
        "faults",
        *SYSTEMS,
        "Daly closed form",
        "ckpt every s",
    ]
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>replicaft at scale</title><style>{STYLE}</style>",
        "</head><body><h1>replicaft at scale: simulated goodput</h1>",
        f"<p>{escape(result.notes)}{' Run with <code>--quick</code>.' if p['quick'] else ''}</p>",
        f"<h2>At {largest['groups']:,} groups ({largest['gpus']:,} GPUs), Llama 3's failure rate</h2>",
        _table(goodput_header, _goodput_rows([largest], "label")),
        line_chart(
            "Goodput against the number of groups (Llama 3's per-host rate)",
            {s: [(r["groups"], r["runs"][s]["goodput"]) for r in by_groups] for s in SYSTEMS},
            x_label="replica groups (8 GPUs each)",
            y_label="goodput",
            log_x=True,
        ),
        _table(goodput_header, _goodput_rows(by_groups, "label")),
        line_chart(
            f"Goodput against the failure rate ({by_rate[0]['groups']} groups)",
            {s: [(r["rate_factor"], r["runs"][s]["goodput"]) for r in by_rate] for s in SYSTEMS},
            x_label="failure rate, times Llama 3's",
            y_label="goodput",
            log_x=True,
        ),
        _table(goodput_header, _goodput_rows(by_rate, "label")),
        f"<h2>Time lost per failure, by kind, at {largest['groups']:,} groups</h2>",
        "<p>Job-seconds: the group-seconds lost to faults of the kind, over the groups, per fault "
        "(what the whole job loses); group-seconds per fault beside it.</p>",
        _table(
            ["kind", "faults", *[f"{s} job-s" for s in SYSTEMS], *[f"{s} group-s" for s in SYSTEMS[:2]]],
            _lost_rows(largest),
        ),
        f"<h2>Quorum sizes over time, {largest['groups']:,} groups</h2>",
        _table(["system", "mean size", "min", "share of time full", "changes"], _sizes(largest)),
        line_chart(
            "Quorum size over the run",
            {s: [tuple(x) for x in largest["runs"][s]["quorum_sizes"]["series"]] for s in SYSTEMS[:2]},
            x_label="hours",
            y_label="groups in the quorum",
            steps=True,
        ),
        "<h2>A rule problem: steps longer than the join timeout</h2>",
        f"<p>After one kill, with join_timeout_s={problem['join_timeout_s']:g}: is a group left out of every "
        "quorum for the rest of the run? (benchmarks/scale/left_out.py explains the mechanism.)</p>",
        _table(
            ["system", "groups", "fault", "step / join timeout", "step s", "left out for good", "goodput"],
            (
                [
                    r["system"],
                    r["groups"],
                    r["fault"],
                    r["ratio"],
                    r["step_s"],
                    r["left_out_for_good"],
                    r["goodput_min"],
                ]
                for r in problem["rows"]
            ),
        ),
    ]
    if "validation" in p:
        v = p["validation"]
        parts += ["<h2>Validation against real chaos runs</h2>", _table(list(v["table"][0]), v["table"][1:])]
    parts += [
        "<h2>Costs and where each came from</h2>",
        _table(["cost", "value", "basis"], ([k, v, p["costs_basis"].get(k, "")] for k, v in p["costs"].items())),
        "</body></html>",
    ]
    path.write_text("\n".join(parts) + "\n")
    return path
