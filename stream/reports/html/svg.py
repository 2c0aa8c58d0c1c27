"""Low-level SVG drawing for the charts: the plot frame, round axis scales, shapes, axes, legends.

Coordinates are SVG pixels (y grows downwards); a :class:`Frame` knows where the plot area is, and
the chart computes the pixels of its data from it. Floats are written to 0.1 px.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from stream.reports.html.markup import element, escape, parse_time

__all__ = [
    "FULL_WIDTH",
    "HALF_WIDTH",
    "MARGIN_BOTTOM",
    "MARGIN_LEFT",
    "MARGIN_RIGHT",
    "MARGIN_TOP",
    "Frame",
    "chart_figure",
    "empty_chart_figure",
    "legend",
    "nice_ceiling",
    "svg_line",
    "svg_path",
    "svg_rect",
    "svg_root",
    "svg_text",
    "tick_label",
    "tick_steps",
    "time_axis",
    "tooltip",
    "y_axis",
    "y_axis_title",
]

FULL_WIDTH, HALF_WIDTH = 1000, 540  # full-width and side-by-side charts
MARGIN_TOP, MARGIN_RIGHT, MARGIN_BOTTOM, MARGIN_LEFT = 14, 92, 42, 58

#: Axis tops (times a power of ten) and how many equal steps divide each into round numbers.
_NICE_TOPS = ((1, 5), (1.5, 3), (2, 4), (2.5, 5), (3, 3), (4, 4), (5, 5), (6, 3), (8, 4), (10, 5))


def nice_ceiling(value: float) -> float:
    """The smallest round axis top at or above ``value`` (1 for nothing).

    Parameters
    ----------
    value
        The largest value the axis must show.

    Returns
    -------
    float
        A round number (1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten).

    >>> nice_ceiling(538), nice_ceiling(14.7), nice_ceiling(0)
    (600.0, 15.0, 1.0)
    """
    if value <= 0 or not math.isfinite(value):
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for mantissa, _ in _NICE_TOPS:
        if value <= mantissa * power * (1 + 1e-9):
            return float(mantissa * power)
    return float(10 * power)


def tick_steps(top: float, *, integer: bool = False) -> int:
    """How many grid steps split ``top`` (a :func:`nice_ceiling` value) into round numbers.

    Parameters
    ----------
    top
        The axis top.
    integer
        The axis counts things: below 5 every whole number gets a tick, no fractions.

    Returns
    -------
    int
        The number of steps (ticks are one more).

    >>> tick_steps(600.0), tick_steps(3.0, integer=True)
    (3, 3)
    """
    if integer and top < 5:
        return max(int(top), 1)
    mantissa = top / 10 ** math.floor(math.log10(top))
    return min(_NICE_TOPS, key=lambda pair: abs(pair[0] - mantissa))[1]


def tick_label(value: float) -> str:
    """An axis tick's text: thousands separators from 1000 on, else the shortest form.

    Parameters
    ----------
    value
        The tick's value.

    Returns
    -------
    str
        For example ``2,000``, ``0.5`` or ``3``.
    """
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:g}"


class Frame:
    """A chart's plot area in SVG coordinates; y grows upwards in data terms.

    Parameters
    ----------
    height
        The whole chart's height in pixels.
    width
        The whole chart's width in pixels.
    left, right, bottom
        Margins around the plot area, for tick labels, reference labels and the time axis.

    Attributes
    ----------
    x0, x1
        The plot area's left and right edges.
    y0, y1
        The baseline (value 0) and the top of the plot area.
    """

    def __init__(
        self,
        height: int,
        *,
        width: int = FULL_WIDTH,
        left: int = MARGIN_LEFT,
        right: int = MARGIN_RIGHT,
        bottom: int = MARGIN_BOTTOM,
    ) -> None:
        self.width = width
        self.height = height
        self.x0 = left
        self.x1 = width - right
        self.y0 = height - bottom  # the baseline
        self.y1 = MARGIN_TOP

    @property
    def plot_width(self) -> float:
        """The plot area's width in pixels."""
        return self.x1 - self.x0

    @property
    def plot_height(self) -> float:
        """The plot area's height in pixels."""
        return self.y0 - self.y1


def tooltip(text: str) -> str:
    """A hover text (SVG ``<title>``).

    Parameters
    ----------
    text
        Plain text; it is escaped here.

    Returns
    -------
    str
        The ``<title>`` element, to put inside the element it describes.
    """
    return f"<title>{escape(text)}</title>"


def svg_root(frame: Frame, label: str, body: Iterable[str]) -> str:
    """The ``<svg>`` element of one chart.

    Parameters
    ----------
    frame
        The chart's size.
    label
        Its accessible name and hover text.
    body
        The drawn elements, in painting order.

    Returns
    -------
    str
        The SVG, to put in a :func:`chart_figure`.
    """
    attrs = {
        "viewBox": f"0 0 {frame.width} {frame.height}",
        "width": frame.width,
        "height": frame.height,
        "role": "img",
        "aria-label": label,
        "xmlns": "http://www.w3.org/2000/svg",
    }
    return element("svg", attrs, tooltip(label) + "".join(body))


def chart_figure(name: str, title: str, svg: str, legend: str = "", caption: str = "") -> str:
    """A chart in the page: ``<figure class="chart" data-chart=NAME>`` with title, legend and caption.

    Parameters
    ----------
    name
        The chart's stable name (``data-chart``), which the tests and the browser check look for.
    title
        The heading above it (plain text).
    svg
        The chart (:func:`svg_root`).
    legend
        HTML from :func:`legend`, or nothing.
    caption
        Plain text under the chart, or nothing.

    Returns
    -------
    str
        The ``<figure>``.
    """
    content = f"<h3>{escape(title)}</h3>{legend}{svg}"
    if caption:
        content += f"<figcaption>{escape(caption)}</figcaption>"
    return element("figure", {"class": "chart", "data-chart": name}, content)


def empty_chart_figure(name: str, title: str, reason: str) -> str:
    """What stands in for a chart without data: its title and a sentence saying why.

    Parameters
    ----------
    name
        The chart's name (``data-chart``).
    title
        Its heading (plain text).
    reason
        Why there is nothing to draw (plain text).

    Returns
    -------
    str
        A ``<figure class="chart empty">`` without SVG.
    """
    content = f'<h3>{escape(title)}</h3><p class="empty">{escape(reason)}</p>'
    return element("figure", {"class": "chart empty", "data-chart": name}, content)


def legend(items: Sequence[tuple[str, str, str]]) -> str:
    """A chart's legend, as HTML above the SVG.

    Parameters
    ----------
    items
        ``(colour, label, style)`` items; style ``bar``, ``line`` or ``dash``.

    Returns
    -------
    str
        A ``<div class="legend">`` of swatches and labels.
    """
    keys = "".join(
        element(
            "span",
            {"class": "key"},
            element("span", {"class": f"swatch {style}", "style": f"--c:{colour}"}) + escape(label),
        )
        for colour, label, style in items
    )
    return f'<div class="legend">{keys}</div>'


def svg_line(css: str, x1: float, x2: float, y1: float, y2: float, content: str = "", **extra: str) -> str:
    """A ``<line>`` of class ``css`` from ``(x1, y1)`` to ``(x2, y2)``; ``extra`` are more attributes.

    Parameters
    ----------
    css
        Its class (its look comes from the page's CSS).
    x1, x2, y1, y2
        Its ends in SVG pixels.
    content
        Its content as SVG, such as a :func:`tooltip`.
    **extra
        More attributes (``stroke-dasharray`` ...), after the coordinates.

    Returns
    -------
    str
        The element.
    """
    attrs = {"class": css, "x1": float(x1), "x2": float(x2), "y1": float(y1), "y2": float(y2)}
    return element("line", {**attrs, **extra}, content)


def svg_text(css: str, x: float, y: float, text: str, anchor: str = "start") -> str:
    """A ``<text>`` of class ``css`` at ``(x, y)``.

    Parameters
    ----------
    css
        Its class.
    x, y
        Its anchor point (``y`` is the baseline) in SVG pixels.
    text
        Plain text; it is escaped here.
    anchor
        ``start``, ``middle`` or ``end``.

    Returns
    -------
    str
        The element.
    """
    return element("text", {"class": css, "x": float(x), "y": float(y), "text-anchor": anchor}, escape(text))


def svg_rect(css: str, x: float, y: float, width: float, height: float, fill: str | None, tip: str) -> str:
    """A ``<rect>`` (a bar) with a hover text; a negative height draws nothing visible.

    Parameters
    ----------
    css
        Its class.
    x, y
        Its top-left corner in SVG pixels.
    width, height
        Its size in pixels.
    fill
        Its colour, or ``None`` to leave it to the CSS.
    tip
        The hover text (plain text).

    Returns
    -------
    str
        The element.
    """
    attrs: dict[str, Any] = {"class": css, "x": float(x), "y": float(y), "width": float(width)}
    attrs["height"] = float(max(height, 0.0))
    if fill:
        attrs["fill"] = fill
    return element("rect", attrs, tooltip(tip))


def svg_path(
    css: str, points: Sequence[tuple[float, float]], tip: str, *, close: bool = False, **extra: str
) -> str:
    """A ``<path>`` through ``points`` (a polyline, or a polygon if ``close``) with a hover text.

    Parameters
    ----------
    css
        Its class.
    points
        Its ``(x, y)`` corners in SVG pixels, in order.
    tip
        The hover text (plain text).
    close
        Join the last point to the first.
    **extra
        More attributes (``stroke``, ``clip-path``, ``stroke-dasharray`` ...).

    Returns
    -------
    str
        The element.
    """
    d = " ".join(f"{'M' if i == 0 else 'L'}{x:.1f} {y:.1f}" for i, (x, y) in enumerate(points))
    return element("path", {"class": css, "d": d + (" Z" if close else ""), **extra}, tooltip(tip))


def y_axis(frame: Frame, top: float, label: str, *, integer: bool = False) -> list[str]:
    """Grid lines and labels of a linear y axis from 0 to ``top``.

    Parameters
    ----------
    frame
        The chart's plot area.
    top
        The value at the top of the plot area (a :func:`nice_ceiling` value).
    label
        The axis title.
    integer
        The axis counts things (see :func:`tick_steps`).

    Returns
    -------
    list[str]
        The elements, to draw before the data.
    """
    ticks = tick_steps(top, integer=integer)
    out = []
    for i in range(ticks + 1):
        y = frame.y0 - frame.plot_height * i / ticks
        out.append(svg_line("grid", frame.x0, frame.x1, y, y))
        out.append(svg_text("tick", frame.x0 - 6, y + 4, tick_label(top * i / ticks), "end"))
    out.append(y_axis_title(frame, label))
    return out


def y_axis_title(frame: Frame, label: str) -> str:
    """The y axis title, turned to read upwards, left of the plot area.

    Parameters
    ----------
    frame
        The chart's plot area.
    label
        The title (plain text).

    Returns
    -------
    str
        A ``<text>`` element.
    """
    y = (frame.y0 + frame.y1) / 2
    attrs = {
        "class": "axis-title",
        "transform": f"translate(14 {y:.1f}) rotate(-90)",
        "text-anchor": "middle",
    }
    return element("text", attrs, escape(label))


def time_axis(frame: Frame, starts: Sequence[str], bin_seconds: int) -> list[str]:
    """Tick labels under evenly spaced bins (about seven of them).

    Parameters
    ----------
    frame
        The chart's plot area.
    starts
        Each bin's start time, in order (report timestamps).
    bin_seconds
        The bins' length: from a day on, ticks show the date only.

    Returns
    -------
    list[str]
        The axis line, tick marks and labels.
    """
    n = len(starts)
    every = max(1, math.ceil(n / 7))
    fmt = "%b %d" if bin_seconds >= 86400 else "%b %d %H:%M"
    out = [svg_line("axis", frame.x0, frame.x1, frame.y0, frame.y0)]
    for i in range(0, n, every):
        x = frame.x0 + frame.plot_width * (i + 0.5) / n
        out.append(svg_line("axis", x, x, frame.y0, frame.y0 + 4))
        out.append(svg_text("tick", x, frame.y0 + 17, parse_time(starts[i]).strftime(fmt), "middle"))
    return out
