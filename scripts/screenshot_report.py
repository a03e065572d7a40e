"""Write RUN/report.html and screenshot it with headless Chromium: `screenshot_report.py RUN out.png`.

Used to check by eye that the report's curves render. Needs a Chromium binary (`apt-get install
chromium` on Debian; or set CHROMIUM to its path). The browser gets a throwaway profile and every
background network feature off, so rendering the report touches no network.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from grpokit.store.report import write_report

_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str:
    candidates = [os.environ["CHROMIUM"]] if "CHROMIUM" in os.environ else _BROWSERS
    for name in candidates:
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("no Chromium found: install it (apt-get install chromium) or set CHROMIUM")


def run_headless(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """Headless Chromium with ``args``, in a throwaway profile with every background network feature off."""
    with tempfile.TemporaryDirectory(prefix="grpokit-chromium-") as profile:
        command = [
            find_chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            *args,
        ]
        return subprocess.run(command, check=False, capture_output=True, text=True, timeout=timeout)


def screenshot(html: Path, out: Path, width: int = 1280, height: int = 2400, suffix: str = "") -> None:
    """A PNG of ``html`` opened at its address plus ``suffix`` (a query string or a fragment: "?step=5", "#heldout")."""
    url = html.resolve().as_uri() + suffix
    result = run_headless(f"--screenshot={out.resolve()}", f"--window-size={width},{height}", url)
    if result.returncode != 0 or not out.is_file():
        raise SystemExit(f"chromium failed ({result.returncode}):\n{result.stderr[-2000:]}")


def dump_dom(html: Path, width: int = 1280) -> str:
    """The page's DOM after its scripts ran (what tests read layout measurements from)."""
    result = run_headless("--dump-dom", f"--window-size={width},2400", html.resolve().as_uri())
    if result.returncode != 0:
        raise SystemExit(f"chromium failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return result.stdout


def open_page(url: str, width: int = 1280) -> tuple[str, list[str]]:
    """(the DOM after the page's scripts ran, every console message the page gave: a log, an error, an uncaught
    exception) of ``url`` (a file:// address, with a query string or a fragment if wanted)."""
    result = run_headless("--enable-logging=stderr", "--v=0", "--dump-dom", f"--window-size={width},2400", url)
    if result.returncode != 0:
        raise SystemExit(f"chromium failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return result.stdout, [line for line in result.stderr.splitlines() if ":CONSOLE" in line]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="run folder")
    parser.add_argument("out", type=Path, help="PNG to write")
    parser.add_argument("--height", type=int, default=2400, help="page height in pixels")
    args = parser.parse_args(argv)
    html = write_report(args.run)
    screenshot(html, args.out, height=args.height)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
