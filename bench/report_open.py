"""How long report.html of a long run takes to open in headless Chromium; prints `key=value` lines.

Writes a synthetic run (scripts/synthetic_run.py: 2,000 steps of 5 groups x 10 = 100,000 rollouts, an evaluation
of 100 prompts every 100 steps by default), its report, then opens the page `--repeat` times in headless Chromium
from file:// and reads the browser's own navigation timing (`load_ms`: navigation start to the end of the load
event, the page's script included) from a copy of the page with a probe appended. Also prints the page's size and
the time `grpokit report` took to write it. The target (issue 51): under 10 MB and under 2 s to open.

    python bench/report_open.py [--steps 2000] [--groups 5] [--group-size 10] [--repeat 3]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import screenshot_report
from synthetic_run import write_synthetic_run

from grpokit.store import write_report

# After the load event (and the page's script, which runs before it): the browser's navigation timing, in the DOM.
PROBE = """<pre id="timing"></pre><script>
window.addEventListener("load", () => setTimeout(() => {
  const n = performance.getEntriesByType("navigation")[0];
  document.getElementById("timing").textContent =
    "load_ms=" + n.loadEventEnd.toFixed(0) + " dom_content_loaded_ms=" + n.domContentLoadedEventEnd.toFixed(0);
}, 0));
</script>"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--groups", type=int, default=5)
    parser.add_argument("--group-size", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="grpokit-report-bench-") as tmp:
        run = write_synthetic_run(Path(tmp) / "run", args.steps, args.groups, args.group_size, eval_every=100)
        started = time.perf_counter()
        page = write_report(run)
        write_seconds = time.perf_counter() - started
        size = page.stat().st_size
        probe = page.with_name("probe.html")
        probe.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
        loads, ready, walls = [], [], []
        for _ in range(args.repeat):
            started = time.perf_counter()
            dom, console = screenshot_report.open_page(probe.resolve().as_uri())
            walls.append(time.perf_counter() - started)
            if console:
                print("console:", *console, sep="\n  ", file=sys.stderr)
            found = re.search(r"load_ms=(\d+) dom_content_loaded_ms=(\d+)", dom)
            if found is None:
                raise SystemExit("the probe found no navigation timing (the page did not finish loading)")
            loads.append(int(found.group(1)))
            ready.append(int(found.group(2)))
    print(f"rollouts={args.steps * args.groups * args.group_size}")
    print(f"page_bytes={size}")
    print(f"report_write_seconds={write_seconds:.2f}")
    print(f"load_ms_median={statistics.median(loads):.0f}  (each: {loads})")
    print(f"dom_content_loaded_ms_median={statistics.median(ready):.0f}")
    print(f"chromium_wall_seconds_median={statistics.median(walls):.2f}  (browser start and exit included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
