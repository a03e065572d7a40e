"""The report's charts are total: any floats (flat series, values equal up to rounding, NaN, inf, huge ranges, one
point) draw in bounded time and memory.

The bug this holds: the tick loop added the step to a running value, and for a chart whose values differed only
by float rounding (reward -0.3375 and -0.33749999999999997) the step was below the value's rounding, so the value
never grew and the list of ticks grew until memory ran out (one `grpokit report` reached 21 GB). A hang would
hang the test, so each check runs under an alarm that turns it into a failure.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import re
import resource
import signal
import sys
import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from grpokit.store.report import report_page
from grpokit.store.svg import line_chart, nice_ticks

ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True)
FINITE = st.floats(allow_nan=False, allow_infinity=False)
# Values that differ only in their last bits: the shape of the bug.
NEAR = st.builds(lambda v, ulps: [v, *(math.nextafter(v, math.inf) for _ in range(ulps))], FINITE, st.integers(1, 3))
WIDTH, HEIGHT = 560, 260
GUARD_SECONDS = 60  # far above any correct run (milliseconds): only an endless loop reaches it
GUARD_MEMORY = 500 * 2**20  # bytes the process may grow by inside the guard; a runaway list passes it in a second


@contextlib.contextmanager
def hang_guard(seconds: float = GUARD_SECONDS, memory: int = GUARD_MEMORY):
    """Fail (TimeoutError, MemoryError) instead of hanging, or eating the machine's memory, when the block runs
    past ``seconds`` or grows the process by more than ``memory`` bytes (checked five times a second)."""
    start, peak = time.monotonic(), _peak_rss()

    def check(signum, frame):
        if _peak_rss() - peak > memory:
            raise MemoryError(f"grew by more than {memory >> 20} MiB: a runaway loop")
        if time.monotonic() - start > seconds:
            raise TimeoutError(f"still running after {seconds} s: an endless loop")

    previous = signal.signal(signal.SIGALRM, check)
    delay, interval = signal.setitimer(signal.ITIMER_REAL, 0.2, 0.2)  # another timer's (pytest-timeout's), if any
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if delay:  # give the other timer back what it had left
            signal.setitimer(signal.ITIMER_REAL, max(delay - (time.monotonic() - start), 0.001), interval)


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def coordinates(svg: str) -> list[float]:
    """Every number the chart places: polyline points, circle centres, line ends, text positions."""
    numbers = []
    for attr in re.findall(r'\b(?:points|cx|cy|x|y|x1|x2|y1|y2)="([^"]*)"', svg):
        numbers += [float(v) for v in re.split(r"[ ,]+", attr.strip()) if v]
    return numbers


def test_the_values_that_hung_the_report():
    """-0.3375 and -0.33749999999999997 (one float apart): a few ticks, a flat line in the middle of the chart."""
    a, b = -0.3375, -0.33749999999999997
    assert a != b and math.nextafter(a, 0) == b
    with hang_guard():
        assert nice_ticks(a, b) == [a]
        svg = line_chart("Reward", {"reward": [(1, a), (2, b), (3, a)]})
    ys = {float(y) for y in re.findall(r'<circle cx="[^"]*" cy="([^"]*)"', svg)}
    assert len(ys) == 1  # equal up to rounding: drawn as one flat line
    top, plot_h = 28, HEIGHT - 28 - (40 + 16)
    assert ys.pop() == pytest.approx(top + plot_h / 2, abs=0.1)  # mid-chart
    assert len(re.findall(r'class="grid"', svg)) <= 6


def test_a_report_of_such_metrics_is_written(tmp_path):
    """The same values through `grpokit report`'s page (metrics.jsonl only, as a run without a store)."""
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": s, "reward": -0.3375 if s % 2 else -0.33749999999999997, "entropy": 0.0} for s in range(1, 6)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with hang_guard():
        page = report_page(run)
    assert page.count("<svg") == 2  # reward and entropy (a flat 0 is drawn where 0 is a value, not "nothing")
    assert len(page) < 200_000


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lo=ANY_FLOAT, hi=ANY_FLOAT, count=st.integers(1, 12), min_step=st.sampled_from([0.0, 1.0]))
def test_nice_ticks_are_few_finite_increasing_and_cover_the_range(lo, hi, count, min_step):
    with hang_guard():
        ticks = nice_ticks(lo, hi, count, min_step)
    assert len(ticks) <= count + 1
    assert all(math.isfinite(t) for t in ticks)
    assert all(a < b for a, b in itertools.pairwise(ticks))
    if math.isfinite(lo) and math.isfinite(hi) and lo <= hi and len(ticks) > 1:
        step = ticks[1] - ticks[0]
        # every tick within one step of [lo, hi], and no gap of more than a step left at either end
        assert ticks[0] >= lo - step * 1.001 and ticks[-1] <= hi + step * 1.001
        assert ticks[0] - lo <= step * 1.001 and hi - ticks[-1] <= step * 1.001


series_values = st.one_of(
    st.lists(ANY_FLOAT, min_size=1, max_size=40),  # anything, NaN and inf included
    NEAR,  # equal up to rounding
    st.lists(st.sampled_from([-sys.float_info.max, sys.float_info.max, 0.0, 5e-324]), min_size=1, max_size=6),
    FINITE.map(lambda v: [v] * 5),  # constant
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    values=st.lists(series_values, min_size=1, max_size=3),
    steps=st.one_of(st.just(None), st.lists(ANY_FLOAT, min_size=40, max_size=40)),
)
@example(values=[[0.0] * 5, [-2.2250738585072014e-308] * 5], steps=None)  # flat below any float's scale: 0 was off
def test_any_series_draws_inside_the_chart_in_bounded_size(values, steps):
    """Non-finite points are left out; everything drawn lies inside the chart; the page grows with the points,
    never more (a few hundred bytes a point)."""
    series = {f"s{i}": [((steps[j] if steps else j + 1), v) for j, v in enumerate(vs)] for i, vs in enumerate(values)}
    with hang_guard():
        svg = line_chart("chart", series)
    drawable = sum(1 for pts in series.values() for x, y in pts if math.isfinite(x) and math.isfinite(y))
    if drawable == 0:
        assert svg == ""
        return
    assert "nan" not in svg.lower() and "inf" not in svg.lower()
    numbers = coordinates(svg)
    assert numbers and all(-1 <= n <= WIDTH + 1 for n in numbers)  # inside the box (heights are below the width)
    assert len(svg) < 4_000 + 400 * drawable
