"""Make docs/report.png: the HTML report of the bundled example, as headless Chromium shows it.

    python -m tests.services.screenshot                 # replays examples/sim-48x14 into a temporary store
    python -m tests.services.screenshot --store DIR     # an existing embedded store instead
    python -m tests.services.screenshot --html report.html --out /tmp/report.png   # any report file

The same browser set-up as tests/e2e/test_report_html.py (tests/services/browser.py): Debian's
chromium through Playwright.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tests.services.browser import BrowserMissing, png_size, screenshot
from tests.services.worker import ROOT, cli

EXAMPLE_LOGS = ROOT / "examples" / "sim-48x14" / "logs"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.services.screenshot", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--store", type=Path, help="embedded store (chdb folder) to report on")
    parser.add_argument("--html", type=Path, help="screenshot this report file instead of making one")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "report.png", help="PNG to write")
    parser.add_argument("--width", type=int, default=1280, help="viewport width in CSS pixels")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="faultstream-report-") as work:
        html = args.html
        if html is None:
            store = args.store
            if store is None:
                store = Path(work) / "store"
                sys.stderr.write(f"replaying {EXAMPLE_LOGS.relative_to(ROOT)} into {store}\n")
                cli({}, "replay", str(EXAMPLE_LOGS), "--clickhouse", f"chdb://{store}", "--no-progress")
            html = Path(work) / "report.html"
            cli(
                {},
                "report",
                "--html",
                str(html),
                "--clickhouse",
                f"chdb://{store.resolve()}",
                "--no-progress",
            )
        args.out.parent.mkdir(parents=True, exist_ok=True)
        try:
            problems = screenshot(html, args.out, {"width": args.width, "height": 900})
        except BrowserMissing as exc:
            sys.stderr.write(f"error: {exc}\n")
            return 1
    for problem in problems.all():
        sys.stderr.write(f"warning: {problem}\n")
    width, height = png_size(args.out)
    sys.stdout.write(f"wrote {args.out} ({width}x{height}, {args.out.stat().st_size / 1024:,.0f} KiB)\n")
    return 1 if problems.all() else 0


if __name__ == "__main__":
    raise SystemExit(main())
