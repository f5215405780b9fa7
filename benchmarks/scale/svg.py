"""Line charts as inline SVG, for the results page (no plotting library is installed, and a
page that carries its charts as text diffs and reviews like the JSON beside it)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

WIDTH, HEIGHT = 640, 320
LEFT, RIGHT, TOP, BOTTOM = 64, 150, 28, 44
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")

Series = Mapping[str, Sequence[tuple[float, float]]]


def _ticks(lo: float, hi: float, count: int = 5, *, integer: bool = False) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / count
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 2.5, 5, 10) if m * step >= raw)
    step = max(step, 1.0) if integer else step
    first = math.ceil(lo / step) * step
    return [round(first + i * step, 10) for i in range(int((hi - first) / step + 1e-9) + 1)]


def _label(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 and v == round(v) else f"{v:,.6g}"


def line_chart(
    title: str,
    series: Series,
    *,
    x_label: str,
    y_label: str,
    log_x: bool = False,
    steps: bool = False,
) -> str:
    """One chart: each series a line with its points marked (``steps``: a step function of whole
    numbers, for quorum sizes over time), a legend at the right, axes with round ticks."""
    points = [p for s in series.values() for p in s]
    if not points:
        return f"<p>{escape(title)}: no data</p>"
    fx = (lambda v: math.log10(v)) if log_x else (lambda v: v)
    xs = [fx(x) for x, _ in points]
    x_lo, x_hi = min(xs), max(xs)
    if x_hi == x_lo:
        x_hi = x_lo + 1
    y_lo, y_hi = min(y for _, y in points), max(y for _, y in points)
    if y_hi == y_lo:
        y_lo, y_hi = y_lo - 0.5, y_hi + 0.5
    pad = (y_hi - y_lo) * 0.05
    y_lo, y_hi = y_lo - pad, y_hi + pad
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (fx(x) - x_lo) / (x_hi - x_lo) * plot_w

    def py(y: float) -> float:
        return TOP + (1 - (y - y_lo) / (y_hi - y_lo)) * plot_h

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'aria-label="{escape(title)}" font-family="sans-serif" font-size="11">',
        f'<text x="{WIDTH / 2:.0f}" y="16" text-anchor="middle" font-size="13">{escape(title)}</text>',
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>',
    ]
    for y in _ticks(y_lo, y_hi, integer=steps):
        out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{py(y):.1f}" y2="{py(y):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{LEFT - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{_label(y)}</text>')
    x_values = sorted({x for x, _ in points}) if log_x else _ticks(min(x for x, _ in points), max(x for x, _ in points))
    for x in x_values:
        out.append(f'<text x="{px(x):.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{_label(x)}</text>')
    out.append(f'<text x="{LEFT + plot_w / 2:.0f}" y="{HEIGHT - 8}" text-anchor="middle">{escape(x_label)}</text>')
    out.append(
        f'<text x="14" y="{TOP + plot_h / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 14 {TOP + plot_h / 2:.0f})">{escape(y_label)}</text>'
    )
    for i, (name, pts) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        path: list[str] = []
        for j, (x, y) in enumerate(pts):
            if steps and j:
                path.append(f"{px(x):.1f},{py(pts[j - 1][1]):.1f}")
            path.append(f"{px(x):.1f},{py(y):.1f}")
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{" ".join(path)}"/>')
        if not steps:
            out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}"/>' for x, y in pts]
        ly = TOP + 14 + i * 16
        out.append(f'<rect x="{LEFT + plot_w + 10}" y="{ly - 8}" width="12" height="3" fill="{colour}"/>')
        out.append(f'<text x="{LEFT + plot_w + 26}" y="{ly - 3}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)
