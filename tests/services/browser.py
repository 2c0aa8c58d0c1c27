"""Headless Chromium, driven by Playwright, for the tests (and the docs screenshot) that look at pages.

The browser is Debian's `chromium` package at /usr/bin/chromium (`.ci/run` installs it);
Playwright's own browser downloads are never used (`playwright install` needs the internet).
A missing browser is an error that says what to install, never a reason to skip.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 900}


class BrowserMissing(RuntimeError):
    """Chromium or Playwright is not installed; the message says how to install it."""


def chromium() -> str:
    """The Chromium executable, or :class:`BrowserMissing` saying what to install."""
    if Path(CHROMIUM).is_file():
        return CHROMIUM
    found = shutil.which("chromium")
    if found:
        return found
    raise BrowserMissing(
        f"Chromium is not installed ({CHROMIUM} is missing): install the Debian package with "
        "`apt-get install -y --no-install-recommends chromium` (.ci/run does this on a fresh machine)"
    )


@dataclass
class PageProblems:
    """What went wrong while a page loaded: console errors, uncaught errors, failed or outside requests."""

    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def all(self) -> list[str]:
        return (
            [f"console error: {m}" for m in self.console_errors]
            + [f"page error: {m}" for m in self.page_errors]
            + [f"request failed: {m}" for m in self.failed_requests]
        )


@contextmanager
def open_page(path: Path, viewport: dict[str, int] | None = None) -> Iterator[tuple[Any, PageProblems]]:
    """Open a local file in headless Chromium; yield the Playwright page and what went wrong loading it."""
    executable = chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        raise BrowserMissing(f"Playwright is not installed ({exc}): `pip install -e '.[dev]'`") from None
    problems = PageProblems()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=LAUNCH_ARGS)
        try:
            page = browser.new_page(viewport=viewport or VIEWPORT)
            page.on(
                "console", lambda m: problems.console_errors.append(m.text) if m.type == "error" else None
            )
            page.on("pageerror", lambda error: problems.page_errors.append(str(error)))
            page.on("requestfailed", lambda r: problems.failed_requests.append(f"{r.url} ({r.failure})"))
            page.on("request", lambda r: problems.requests.append(r.url))
            page.goto(path.resolve().as_uri(), wait_until="load")
            yield page, problems
        finally:
            browser.close()


def screenshot(html: Path, png: Path, viewport: dict[str, int] | None = None) -> PageProblems:
    """Save a full-page PNG of a local HTML file; return what went wrong loading it."""
    with open_page(html, viewport) as (page, problems):
        page.screenshot(path=str(png), full_page=True)
    return problems


def png_size(png: Path) -> tuple[int, int]:
    """Width and height from a PNG's header (and a check that it is one)."""
    data = png.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{png} is not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
