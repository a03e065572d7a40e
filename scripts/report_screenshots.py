"""Regenerate docs/runs.md's screenshots: `report_screenshots.py [OUT_DIR]` (default docs/images).

Writes two synthetic runs (scripts/synthetic_run.py: 100 and 60 steps, different settings), the first one's
report.html and `grpokit compare` of both, and screenshots them with headless Chromium (scripts/screenshot_report.py):
report-curves.png, report-groups.png, report-heldout.png, report-tokens.png, compare.png. Needs Chromium
(`apt-get install chromium`).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import screenshot_report
from synthetic_run import write_synthetic_run

from grpokit.cli import main as grpokit
from grpokit.store import write_report

SHOTS = (
    ("report-curves", "", 1500),
    ("report-groups", "?step=51", 1100),
    ("report-heldout", "?view=heldout", 1000),
    ("report-tokens", "?view=tokens", 1000),
)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else Path(__file__).resolve().parents[1] / "docs" / "images")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="grpokit-shots-") as tmp:
        a = write_synthetic_run(Path(tmp) / "lr-1e-4", steps=100, groups=5, group_size=8, token_values=True)
        b = write_synthetic_run(
            Path(tmp) / "lr-3e-4", steps=60, groups=5, group_size=8, seed=1, config={"optim": {"learning_rate": 3e-4}}
        )
        page = write_report(a)
        for name, suffix, height in SHOTS:
            screenshot_report.screenshot(page, out / f"{name}.png", height=height, suffix=suffix)
        compare = Path(tmp) / "compare.html"
        grpokit(["compare", str(a), str(b), "-o", str(compare)])
        screenshot_report.screenshot(compare, out / "compare.png", height=1400)
    print(f"wrote {', '.join(f'{n}.png' for n, _, _ in SHOTS)}, compare.png to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
