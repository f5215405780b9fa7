"""``report.html``: one self-contained page per run — timeline, figures, invariant verdicts.

The page must open anywhere a run directory is copied to (a CI artifact, a laptop with no
network), so it loads nothing: the timeline is SVG written here directly, the style is
inline, and there is no script. matplotlib was rejected for the same reason and because it
is not a dependency. Pure: returns a string; every value from a run is HTML-escaped.
"""

from __future__ import annotations

import html
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from chaos.record import ALL_GROUPS, DISK, JOB_TARGETS, LIGHTHOUSE, InjectedFault
from chaos.timeline import Commit, next_commit

_PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f")
_FAULT_COLOR = {
    "sigkill": "#d62728",
    "sigkill_rank": "#d62728",
    "fault_point": "#d62728",
    "kill_donor_mid_heal": "#a50f15",
    "sigterm": "#e07b00",
    "sigstop": "#bcbd22",
    "kill_lighthouse": "#444444",
    "kill_all_groups": "#67000d",
    "corrupt_checkpoint": "#67000d",
    "preemption_notice": "#e07b00",
    "fill_disk": "#8c564b",
    "partition": "#6a3d9a",
    "slow_link": "#17becf",
}
_RESUME_CLASS = {"ok": "held", "diverged": "violated", "not_enough_data": "not_checked"}
"""A resume's loss verdict in the colours of an invariant's."""
_SHORT_TARGET = {LIGHTHOUSE: "lh", ALL_GROUPS: "all", DISK: "disk"}
_W, _H = 960, 380
_LEFT, _RIGHT, _TOP, _BOTTOM = 56, 150, 44, 40

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1000px; color: #222; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; }
table { border-collapse: collapse; margin: 8px 0; } td, th { border: 1px solid #ccc; padding: 4px 10px; text-align:
left; vertical-align: top; }
th { background: #f3f3f3; } .held { color: #1a7f37; font-weight: 600; } .violated { color: #c62828; font-weight: 600; }
.not_checked { color: #8a6d00; font-weight: 600; } .muted { color: #666; } svg text { font: 11px system-ui, sans-serif;
}
.verdict { font-size: 18px; font-weight: 600; padding: 8px 12px; display: inline-block; border-radius: 4px; }
.ok { background: #e6f4ea; color: #1a7f37; } .bad { background: #fdecea; color: #c62828; }
"""


def _ticks(hi: float, n: int = 8) -> list[float]:
    """Round tick positions from 0 to ``hi``, about ``n`` of them, 1, 2 or 5 times a power of ten apart."""
    if hi <= 0:
        return [0.0]
    raw = hi / n
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    return [i * step for i in range(int(hi / step) + 1)]


def timeline_svg(
    all_commits: Sequence[Commit], faults: Sequence[InjectedFault], *, t0: float, t_end: float, target_steps: int
) -> str:
    """Committed step against seconds since the run started: one line per group process, faults marked."""
    span = max(t_end - t0, 1.0)
    top_step = max([target_steps, *(c.step for c in all_commits)])
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def x(ts: float) -> float:
        return _LEFT + (ts - t0) / span * plot_w

    def y(step: float) -> float:
        return _TOP + plot_h - step / max(top_step, 1) * plot_h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" role="img" '
        'aria-label="committed step over time per group, faults marked">'
    ]
    for f in faults:  # shaded until the target trains again: its first commit after it came back
        back = (
            None
            if f.resumed_ts is None
            else next_commit(all_commits, f.resumed_ts, group=None if f.target in JOB_TARGETS else f.target)
        )
        end = back.ts if back is not None else t_end
        color = _FAULT_COLOR.get(f.kind, "#d62728")
        parts.append(
            f'<rect x="{x(f.ts):.1f}" y="{_TOP}" width="{max(x(end) - x(f.ts), 1):.1f}" height="{plot_h}" '
            f'fill="{color}" opacity="0.10"/>'
        )
    for t in _ticks(span):
        parts.append(
            f'<line x1="{x(t0 + t):.1f}" y1="{_TOP}" x2="{x(t0 + t):.1f}" y2="{_TOP + plot_h}" stroke="#eee"/>'
        )
        parts.append(f'<text x="{x(t0 + t):.1f}" y="{_TOP + plot_h + 16}" text-anchor="middle">{t:g}</text>')
    for s in _ticks(top_step, 6):
        parts.append(f'<line x1="{_LEFT}" y1="{y(s):.1f}" x2="{_LEFT + plot_w}" y2="{y(s):.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{_LEFT - 6}" y="{y(s) + 4:.1f}" text-anchor="end">{s:g}</text>')
    parts.append(f'<rect x="{_LEFT}" y="{_TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>')
    parts.append(
        f'<text x="{_LEFT + plot_w / 2}" y="{_H - 6}" text-anchor="middle">seconds since the run started</text>'
    )
    parts.append(
        f'<text x="14" y="{_TOP + plot_h / 2}" text-anchor="middle" transform="rotate(-90 14 '
        f'{_TOP + plot_h / 2})">committed step</text>'
    )

    lines: dict[tuple[str, int], list[Commit]] = defaultdict(list)
    for c in all_commits:
        if c.rank == 0:
            lines[(c.group, c.incarnation)].append(c)
    groups = sorted({g for g, _ in lines})
    color_of = {g: _PALETTE[i % len(_PALETTE)] for i, g in enumerate(groups)}
    for (group, incarnation), cs in sorted(lines.items()):
        cs.sort(key=lambda c: c.ts)
        # Groups in one quorum commit the same steps at nearly the same time; a small offset
        # per group keeps every line visible instead of the last one hiding the others.
        dy = (groups.index(group) - (len(groups) - 1) / 2) * 2.0
        # A staircase, not a slope: between two commits the group's step did not change, and a
        # straight segment across a stall (a SIGSTOP) would draw progress that never happened.
        xy = [(x(cs[0].ts), y(cs[0].step) + dy)]
        for prev, cur in zip(cs, cs[1:], strict=False):
            xy += [(x(cur.ts), y(prev.step) + dy), (x(cur.ts), y(cur.step) + dy)]
        points = " ".join(f"{px:.1f},{py:.1f}" for px, py in xy)
        dash = ' stroke-dasharray="5 3"' if incarnation > 1 else ""
        title = html.escape(f"{group} process {incarnation}: steps {cs[0].step}-{cs[-1].step}")
        parts.append(
            f'<polyline points="{points}" fill="none" stroke="{color_of[group]}" stroke-width="1.8"{dash}>'
            f"<title>{title}</title></polyline>"
        )
        first = cs[0]
        parts.append(f'<circle cx="{x(first.ts):.1f}" cy="{y(first.step) + dy:.1f}" r="3" fill="{color_of[group]}"/>')
    for i, f in enumerate(faults):
        color = _FAULT_COLOR.get(f.kind, "#d62728")
        label = html.escape(f.label or f"{f.kind} {f.target}")
        parts.append(
            f'<line x1="{x(f.ts):.1f}" y1="{_TOP - 4}" x2="{x(f.ts):.1f}" y2="{_TOP + plot_h}" stroke="{color}" '
            f'stroke-width="1.5"><title>{label}</title></line>'
        )
        parts.append(
            f'<text x="{x(f.ts) + 3:.1f}" y="{_TOP - 8 - (i % 3) * 11}" fill="{color}">'
            f"{html.escape(f.kind)} {html.escape(_SHORT_TARGET.get(f.target, f.target))}</text>"
        )
    for i, g in enumerate(groups):
        ly = _TOP + 10 + i * 18
        parts.append(
            f'<line x1="{_W - _RIGHT + 12}" y1="{ly}" x2="{_W - _RIGHT + 36}" y2="{ly}" stroke="{color_of[g]}" '
            'stroke-width="2"/>'
        )
        parts.append(f'<text x="{_W - _RIGHT + 42}" y="{ly + 4}">{html.escape(g)}</text>')
    note_y = _TOP + 16 + len(groups) * 18
    for i, note in enumerate(("dot: first commit", "dashed: restarted", "shaded: fault until", "target commits again")):
        parts.append(f'<text x="{_W - _RIGHT + 12}" y="{note_y + i * 14}" fill="#666">{note}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def _table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(value: Any) -> str:
    if value is None:
        return '<span class="muted">—</span>'
    if isinstance(value, dict | list):
        return html.escape(json.dumps(value))
    return html.escape(f"{value:.3g}" if isinstance(value, float) else str(value))


def _per_group(counts: dict[str, int]) -> str:
    """``g0: 0, g1: 1``: a count per group, every group shown, so a restarted group is seen by name."""
    return ", ".join(f"{gid}: {n}" for gid, n in sorted(counts.items())) or "—"


def _seconds(figures: dict[str, dict[str, float]]) -> str:
    return "; ".join(f"{kind}: median {v['median']:.2f}, max {v['max']:.2f}" for kind, v in figures.items()) or "—"


def _checkpoint_section(summary: dict[str, Any]) -> list[str]:
    """The cadence decisions and the saves' figures (chaos/checkpoint_telemetry.py), when there were saves."""
    cadence, saves = summary.get("cadence_decisions"), summary.get("save_telemetry")
    if not cadence or not saves or not (cadence["count"] or saves["count"]):
        return []
    last = cadence["last"] or {}
    rows = [
        ("cadence decisions", cadence["count"]),
        ("intervals chosen (s)", cadence["intervals_s"] or None),
        *(
            (f"last decision: {k}", last.get(k))
            for k in ("group", "at_s", "interval_s", "cost_s", "mtbf_s", "mtbf_source", "reason")
            if last
        ),
        ("saves", f"{saves['count']} ({_per_group(saves['statuses'])})"),
        ("median save duration s", saves["median_duration_s"]),
        ("median blocked s", saves["median_blocked_s"]),
        ("median throughput MB/s", saves["median_throughput_mb_s"]),
        ("anomalies", len(saves["anomalies"])),
    ]
    return [
        "<h2>Checkpoints</h2>",
        _table([[html.escape(k), _fmt(v)] for k, v in rows], ["figure", "value"]),
        *(
            [
                _table(
                    [
                        [_fmt(a["group"]), _fmt(a["checkpoint_step"]), _fmt(a["kind"]), _fmt(a["reason"])]
                        for a in saves["anomalies"]
                    ],
                    ["group", "checkpoint step", "anomaly", "why"],
                )
            ]
            if saves["anomalies"]
            else []
        ),
        '<p class="muted">cadence: the intervals checkpoint_interval="auto" chose from the measured save cost '
        "and the time between total failures (replicaft/checkpoint/cadence.py); saves: the published ones' "
        "figures (replicaft/checkpoint/telemetry.py).</p>",
    ]


def render_report(
    summary: dict[str, Any], all_commits: Sequence[Commit], faults: Sequence[InjectedFault], *, t0: float, t_end: float
) -> str:
    ok = not summary["violations"]
    verdict = (
        '<span class="verdict ok">all checked invariants held</span>'
        if ok
        else f'<span class="verdict bad">{len(summary["violations"])} violation(s)</span>'
    )
    figures = [
        ("scenario", summary["scenario"]),
        ("committed steps", f"{summary['committed_steps']} of {summary['target_steps']}"),
        ("wall seconds", summary["wall_seconds"]),
        ("faults injected", summary["faults_injected"]),
        ("goodput", summary["goodput"]),
        ("goodput vs fault-free", summary["goodput_vs_fault_free"]),
        ("recovery seconds (fault → survivors' next new step)", _seconds(summary["recovery_seconds"])),
        ("rejoin seconds (target back → its first commit)", _seconds(summary["rejoin_seconds"])),
        ("hangs", summary["hangs"]),
        ("restarts", _per_group(summary["restarts"])),
        *(
            (("restarts in a warm standby", _per_group(summary["restarts_in_standby"])),)
            if any(summary.get("restarts_in_standby", {}).values())
            else ()
        ),
        ("groups × ranks", f"{summary.get('groups')} × {summary.get('ranks_per_group')}"),
        *((f"environment: {k}", v) for k, v in summary.get("environment", {}).items()),
    ]
    fault_rows = [
        [
            _fmt(f["label"]) + (f'<br><span class="muted">{_fmt(f["detail"])}</span>' if f.get("detail") else ""),
            _fmt(f["at_s"]),
            _fmt(f["step"]),
            _fmt(f["resumed_at_s"]),
            _fmt(f["recovery_s"]),
            _fmt(f["rejoin_s"]),
        ]
        for f in summary["faults"]
    ]
    fault_rows += [[_fmt(s["fault"]), "not injected", "", "", "", _fmt(s["reason"])] for s in summary["faults_skipped"]]
    verdict_rows = [
        [_fmt(v["invariant"]), f'<span class="{v["status"]}">{v["status"].replace("_", " ")}</span>', _fmt(v["note"])]
        for v in summary["invariants"]
    ]
    resume_rows = [
        [
            _fmt(r["group"]),
            _fmt(r["at_s"]),
            _fmt(r["checkpoint_step"]),
            f'<span class="{_RESUME_CLASS.get(r["verdict"], "muted")}">{_fmt(r["verdict"])}</span>',
            _fmt(r["deviation"]),
            _fmt(r["allowed"]),
            _fmt(r["reason"]),
        ]
        for r in summary.get("resume_verdicts", [])
    ]
    violation_rows = [
        [_fmt(v["invariant"]), _fmt(v["step"]), _fmt(v["group"]), _fmt(v["detail"])] for v in summary["violations"]
    ]
    body = [
        f"<h1>chaos run: {html.escape(summary['scenario'])}</h1>",
        f'<p class="muted">{html.escape(summary["description"])}<br>started {html.escape(summary["started_at"])}, '
        f"output in {html.escape(summary['out_dir'])}</p>",
        verdict,
        "<h2>Timeline</h2>",
        timeline_svg(all_commits, faults, t0=t0, t_end=t_end, target_steps=summary["target_steps"]),
        "<h2>Summary</h2>",
        _table([[html.escape(k), _fmt(v)] for k, v in figures], ["figure", "value"]),
        '<p class="muted">goodput: seconds spent training the steps the job committed (step time less its wait '
        "for a quorum; once per step, median over groups) over the training window, from the start of the first "
        f"committed step to the last commit. vs fault-free: {html.escape(summary['goodput_vs_fault_free_note'])}.</p>",
        "<h2>Faults</h2>",
        _table(fault_rows, ["fault", "at s", "job step", "target back at s", "recovery s", "rejoin s"]),
        "<h2>Invariants</h2>",
        _table(verdict_rows, ["invariant", "verdict", "note"]),
    ]
    if resume_rows:
        body += [
            "<h2>Resumes from disk</h2>",
            _table(resume_rows, ["group", "at s", "checkpoint step", "loss verdict", "deviation", "allowed", "why"]),
            "<p class=\"muted\">each resume's first steps' mean loss against the losses before its checkpoint "
            "(replicaft/persistence/resume_check.py); diverged: the resumed run does not train like the one that saved "
            "it.</p>",
        ]
    body += _checkpoint_section(summary)
    if violation_rows:
        body += ["<h2>Violations</h2>", _table(violation_rows, ["invariant", "step", "group", "detail"])]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>chaos: {html.escape(summary['scenario'])}</title><style>{_STYLE}</style></head>"
        "<body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
