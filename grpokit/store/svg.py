"""Inline SVG line charts for the HTML report: no JavaScript, no fonts or scripts fetched."""

from __future__ import annotations

import itertools
import math
import sys
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
    Total: at most count + 1 ticks for any floats. A range that is empty, flat up to float rounding
    (-0.3375 and -0.33749999999999997) or not finite gives one tick (none when neither end is finite);
    a range wider than the largest float is ticked at half scale.
    """
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [v for v in (lo, hi) if math.isfinite(v)][:1]
    if max(abs(lo), abs(hi)) > _HUGE:  # hi - lo or the step could overflow: tick the halved range
        return [2 * t for t in nice_ticks(lo / 2, hi / 2, count, min_step / 2)]
    if _flat(lo, hi):
        return [lo]
    raw = max((hi - lo) / max(count - 1, 1), min_step)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw * (1 - 1e-9))
    # Tick i is i * step: counted, not accumulated, so rounding cannot stall or stretch the sequence.
    first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    return [i * step for i in range(first, min(last, first + count) + 1)]


# Above this magnitude a range's width could overflow (float max is 1.8e308); below _TINY it underflows.
_HUGE, _TINY = 1e300, 1e-300


def _flat(lo: float, hi: float) -> bool:
    """Whether [lo, hi] is a single value up to float rounding (relative 1e-9, or below any float's scale)."""
    return hi - lo <= max(abs(lo), abs(hi)) * 1e-9 or hi - lo < _TINY


def _y_range(values: list[float]) -> tuple[float, float]:
    """The value axis of finite ``values``: their range padded by 5%; a flat line (equal up to rounding) gets a
    band of 10% of its value around it (0.5 at zero or below any float's scale, e.g. 0 and -2.2e-308), so it
    sits mid-chart with every value inside. Never wider than the floats."""
    lo, hi = min(values), max(values)
    if not _flat(lo, hi):
        pad = (hi / 2 - lo / 2) * 0.1  # 5% of the range, computed at half scale so it cannot overflow
        return _clamp(lo - pad), _clamp(hi + pad)
    pad = max(abs(lo), abs(hi)) * 0.1
    if pad < _TINY:  # a band this narrow could not hold both ends (their spread is up to _TINY)
        pad = 0.5
    middle = lo / 2 + hi / 2
    return _clamp(middle - pad), _clamp(middle + pad)


def _clamp(value: float) -> float:
    return max(-sys.float_info.max, min(sys.float_info.max, value))


def _fraction(value: float, lo: float, hi: float) -> float:
    """Where ``value`` lies in [lo, hi] (hi > lo), 0..1, computed at half scale so no difference overflows."""
    return (value / 2 - lo / 2) / (hi / 2 - lo / 2)


def _tick_labels(ticks: list[float]) -> list[str]:
    """Labels with enough significant digits to tell neighbouring ticks apart (3 at least, 15 at most)."""
    if len(ticks) < 2:
        return [_label(t) for t in ticks]
    step = min(b - a for a, b in itertools.pairwise(ticks))
    scale = max(abs(t) for t in ticks)
    digits = 3 if step <= 0 or scale <= 0 else max(3, min(15, math.ceil(math.log10(scale / step)) + 2))
    return [f"{t:.{digits}g}" for t in ticks]


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


def _finite(series: dict[str, Series]) -> dict[str, Series]:
    """The series' finite points (NaN, inf: a gap in the data, not a place on the axis); series left empty go."""
    kept = {
        name: [(x, y) for x, y in points if math.isfinite(x) and math.isfinite(y)] for name, points in series.items()
    }
    return {name: points for name, points in kept.items() if points}


def _x_range(xs: list[float]) -> tuple[float, float]:
    """The x axis' range; one step: a band of one step either side (10% of it where 1 is below rounding)."""
    x_lo, x_hi = min(xs), max(xs)
    if _flat(x_lo, x_hi):
        pad = abs(x_lo) * 0.1 if _flat(x_lo - 1, x_lo + 1) else 1.0
        x_lo, x_hi = _clamp(x_lo - pad), _clamp(x_lo + pad)
    return x_lo, x_hi


def line_chart(
    title: str,
    series: dict[str, Series],
    width: int = 560,
    height: int = 260,
    x_label: str = "step",
    colors: dict[str, str] | None = None,
) -> str:
    """An SVG chart with one line per named series of (x, value) points (x: the step, or ``x_label``'s quantity),
    with axes and legend; ``colors`` fixes a series' colour (compare: a run's colour on every chart), else the
    palette's in order.

    Returns "" when no series has a point, so callers can skip the chart.
    """
    series = _finite(series)
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
    x_lo, x_hi = _x_range(xs)
    y_lo, y_hi = _y_range(ys)

    def px(x: float) -> float:
        return left + _fraction(x, x_lo, x_hi) * plot_w

    def py(y: float) -> float:
        return top + (1 - _fraction(y, y_lo, y_hi)) * plot_h

    parts = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" '
            f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
            f'aria-label="{escape(title)}">'
        ),
        f'<text x="{left}" y="18" class="title">{escape(title)}</text>',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="frame"/>',
    ]
    y_ticks = nice_ticks(y_lo, y_hi)
    for tick, label in zip(y_ticks, _tick_labels(y_ticks)):
        y = py(tick)
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{label}</text>')
    x_ticks = nice_ticks(x_lo, x_hi, count=6, min_step=1 if x_label == "step" else 0)
    for tick, label in zip(x_ticks, _tick_labels(x_ticks)):
        x = px(tick)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top + plot_h}" y2="{top + plot_h + 4}" class="axis"/>')
        parts.append(f'<text x="{x:.1f}" y="{top + plot_h + 16}" class="tick" text-anchor="middle">{label}</text>')
    parts.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{top + plot_h + 32}" class="tick" text-anchor="middle">'
        f"{escape(x_label)}</text>"
    )
    for i, (name, points) in enumerate(series.items()):
        color = (colors or {}).get(name) or PALETTE[i % len(PALETTE)]
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
        parts.append(
            f'<polyline points="{coords}" fill="none" stroke="{color}" '
            f'stroke-width="1.8"><title>{escape(name)}</title></polyline>'
        )
        if len(points) <= _MAX_MARKERS:
            for x, y in points:
                parts.append(
                    f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" '
                    f'fill="{color}"><title>{escape(name)} {escape(x_label)} {_label(x)}: '
                    f"{y:.6g}</title></circle>"
                )
        legend_x = left + legend[i][0]
        legend_y = top + plot_h + 48 + _LEGEND_ROW_PX * legend[i][1]
        parts.append(f'<rect x="{legend_x:.1f}" y="{legend_y - 9}" width="12" height="3" fill="{color}"/>')
        parts.append(f'<text x="{legend_x + 16:.1f}" y="{legend_y - 4}" class="legend">{escape(name)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)
