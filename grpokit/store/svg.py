"""Inline SVG line charts for the HTML report: no JavaScript, no fonts or scripts fetched."""

from __future__ import annotations

import math
from html import escape

# Tableau 10: distinguishable lines, also for the common forms of colour blindness.
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")
# Above this many points per series the markers (and their hover titles) would be clutter.
_MAX_MARKERS = 150
# Legend text is 11px; 7px per character is above the widest common sans-serif average (digits and
# lower case), so entries laid out by this estimate never overlap. Swatch 12px + 4px gap before the text.
_LEGEND_CHAR_PX, _LEGEND_SWATCH_PX, _LEGEND_GAP_PX, _LEGEND_ROW_PX = 7.0, 16, 14, 16

Series = list[tuple[float, float]]


def nice_ticks(lo: float, hi: float, count: int = 5, min_step: float = 0.0) -> list[float]:
    """About `count` round tick values covering [lo, hi]: steps of 1, 2 or 5 times 10^k.

    The step is the smallest of {1, 2, 5, 10} x 10^floor(log10(raw)) not below
    raw = (hi - lo) / (count - 1), and not below `min_step` (1 keeps step axes on integers).
    """
    if hi <= lo:
        return [lo]
    raw = max((hi - lo) / max(count - 1, 1), min_step)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw * (1 - 1e-9))
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    value = first
    while value <= hi + step * 1e-9:
        ticks.append(round(value / step) * step)  # no 0.30000000000000004 labels
        value += step
    return ticks


def _y_range(values: list[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if hi > lo:
        pad = (hi - lo) * 0.05
        return lo - pad, hi + pad
    # A flat line: give it a band around its value so it sits mid-chart.
    pad = abs(lo) * 0.1 or 0.5
    return lo - pad, hi + pad


def _label(value: float) -> str:
    return f"{value:.3g}"


def legend_layout(names: list[str], width: float) -> list[tuple[float, int]]:
    """(x offset, row) of each legend entry: entries flow left to right and wrap to a new row when
    the next would pass ``width``, each as wide as its estimated text plus swatch and gap."""
    placed, x, row = [], 0.0, 0
    for name in names:
        entry = _LEGEND_SWATCH_PX + _LEGEND_CHAR_PX * len(name)
        if x > 0 and x + entry > width:
            x, row = 0.0, row + 1
        placed.append((x, row))
        x += entry + _LEGEND_GAP_PX
    return placed


def line_chart(title: str, series: dict[str, Series], width: int = 560, height: int = 260) -> str:
    """An SVG chart with one line per named series of (step, value) points, with axes and legend.

    Returns "" when no series has a point, so callers can skip the chart.
    """
    series = {name: points for name, points in series.items() if points}
    if not series:
        return ""
    left, right, top = 64, 16, 28
    legend = legend_layout(list(series), width - left - right)
    rows = legend[-1][1] + 1
    height += _LEGEND_ROW_PX * (rows - 1)  # the plot keeps its height however many legend rows there are
    bottom = 40 + _LEGEND_ROW_PX * rows
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = [x for points in series.values() for x, _ in points]
    ys = [y for points in series.values() for _, y in points]
    x_lo, x_hi = min(xs), max(xs)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    y_lo, y_hi = _y_range(ys)

    def px(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * plot_w

    def py(y: float) -> float:
        return top + (y_hi - y) / (y_hi - y_lo) * plot_h

    parts = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" '
            f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
            f'aria-label="{escape(title)}">'
        ),
        f'<text x="{left}" y="18" class="title">{escape(title)}</text>',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="frame"/>',
    ]
    for tick in nice_ticks(y_lo, y_hi):
        y = py(tick)
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{_label(tick)}</text>')
    for tick in nice_ticks(x_lo, x_hi, count=6, min_step=1):
        x = px(tick)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top + plot_h}" y2="{top + plot_h + 4}" class="axis"/>')
        parts.append(
            f'<text x="{x:.1f}" y="{top + plot_h + 16}" class="tick" text-anchor="middle">{_label(tick)}</text>'
        )
    parts.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{top + plot_h + 32}" class="tick" text-anchor="middle">step</text>'
    )
    for i, (name, points) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
        parts.append(
            f'<polyline points="{coords}" fill="none" stroke="{color}" '
            f'stroke-width="1.8"><title>{escape(name)}</title></polyline>'
        )
        if len(points) <= _MAX_MARKERS:
            for x, y in points:
                parts.append(
                    f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" '
                    f'fill="{color}"><title>{escape(name)} step {_label(x)}: '
                    f"{y:.6g}</title></circle>"
                )
        legend_x = left + legend[i][0]
        legend_y = top + plot_h + 48 + _LEGEND_ROW_PX * legend[i][1]
        parts.append(f'<rect x="{legend_x:.1f}" y="{legend_y - 9}" width="12" height="3" fill="{color}"/>')
        parts.append(f'<text x="{legend_x + 16:.1f}" y="{legend_y - 4}" class="legend">{escape(name)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)
