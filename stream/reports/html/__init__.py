"""The self-contained HTML report."""

from stream.reports.html.page import render_html, write_html

__all__ = ["render_html", "write_html"]
