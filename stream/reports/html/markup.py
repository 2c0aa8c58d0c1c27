"""Markup and the text of values, shared by the charts, the sections and the page.

Every text that comes from the store goes through :func:`escape` (``html.escape``, quotes too)
before it goes into the page; :func:`element` escapes attribute values itself.
"""

from __future__ import annotations

import html
import math
from datetime import datetime
from typing import Any

__all__ = ["element", "escape", "format_count", "format_number", "parse_time", "short_time", "window_label"]


def escape(value: Any) -> str:
    """Escape any value for HTML text or a quoted attribute.

    Parameters
    ----------
    value
        Anything; ``None`` is the empty text, other values their ``str``.

    Returns
    -------
    str
        The text with ``& < > " '`` escaped.

    >>> escape('<b class="x">') + escape(None)
    '&lt;b class=&quot;x&quot;&gt;'
    """
    return html.escape("" if value is None else str(value), quote=True)


def element(tag: str, attrs: dict[str, Any], content: str = "") -> str:
    """One element; attribute values are escaped, floats rounded to 0.1, ``content`` is HTML already.

    Parameters
    ----------
    tag
        The element's name (``rect``, ``div``, ...).
    attrs
        Attribute names and values, written in this order.
    content
        What goes between the tags, as HTML (escape text first).

    Returns
    -------
    str
        The element, start and end tag.

    >>> element("rect", {"x": 1.25, "class": "a&b"})
    '<rect x="1.2" class="a&amp;b"></rect>'
    """
    text = " ".join(
        f'{name}="{value:.1f}"' if isinstance(value, float) else f'{name}="{escape(value)}"'
        for name, value in attrs.items()
    )
    return f"<{tag} {text}>{content}</{tag}>"


def format_number(value: float | None, digits: int = 2) -> str:
    """A number with thousands separators and ``digits`` decimals; ``-`` for none or not finite.

    Parameters
    ----------
    value
        The number, or ``None``.
    digits
        Decimals to show.

    Returns
    -------
    str
        For example ``1,234.50``.

    >>> format_number(1234.5), format_number(None), format_number(float("nan"), 1)
    ('1,234.50', '-', '-')
    """
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:,.{digits}f}"


def format_count(value: int | None) -> str:
    """A count with thousands separators; ``-`` for none.

    Parameters
    ----------
    value
        The count, or ``None``.

    Returns
    -------
    str
        For example ``12,345``.
    """
    return "-" if value is None else f"{value:,}"


def window_label(seconds: int) -> str:
    """A window or bin length in the largest whole unit.

    Parameters
    ----------
    seconds
        The length.

    Returns
    -------
    str
        ``1 d``, ``6 h``, ``15 min`` or ``90 s``.

    >>> window_label(86400), window_label(7200), window_label(900), window_label(90)
    ('1 d', '2 h', '15 min', '90 s')
    """
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def parse_time(text: str) -> datetime:
    """A report timestamp (``YYYY-MM-DD HH:MM:SS``, fractions ignored) as a naive datetime.

    Parameters
    ----------
    text
        The timestamp as the report data holds it.

    Returns
    -------
    datetime
        To the second, without a time zone (the report's times are UTC).
    """
    return datetime.strptime(text[:19], "%Y-%m-%d %H:%M:%S")


def short_time(text: str | None) -> str:
    """A report timestamp to the second, with a space between date and time; ``-`` for none.

    Parameters
    ----------
    text
        The timestamp as the report data holds it (ISO or ClickHouse style), or ``None``.

    Returns
    -------
    str
        For example ``2024-01-01 10:00:00``.

    >>> short_time("2024-01-01T10:00:00.123000"), short_time(None)
    ('2024-01-01 10:00:00', '-')
    """
    return "-" if not text else str(text)[:19].replace("T", " ")
