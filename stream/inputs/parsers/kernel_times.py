"""Time stamps of kernel log lines: every prefix ``dmesg``, ``journalctl`` and syslog print.

:class:`KernelTimes` turns the text before a driver message (``NVRM:`` or ``nvidia-nvswitchN:``)
into ``(ts_ms, host or None)``, or the reason it cannot. Shapes, as documented by util-linux
``dmesg(1)``, ``journalctl(1)`` ``--output`` and RFC 3164 / 5424:

==================================================  ===========================================
prefix                                              placed by
==================================================  ===========================================
``[ 1234.567890]`` (dmesg, ``--time-format raw``,   ``--boot-time`` (seconds since boot)
journalctl ``short-monotonic``), also with the
``< delta>`` of ``dmesg -d``
``[Mon Jan 15 10:23:45 2024]`` (``dmesg -T``,       itself, in ``--timezone``; weekday and month
``--time-format ctime``)                            in the machine's ``LC_TIME`` language
``[Jan15 10:23]`` then ``[  +0.000012]``            ``--year``; to the minute (util-linux prints
(``dmesg -e``, ``--time-format reltime``)           the seconds only as deltas within a minute)
``2024-01-15T10:23:45,123456+00:00`` (``dmesg       itself (offset honoured; none means UTC)
--time-format iso``, journalctl ``short-iso``,
``short-iso-precise``, rsyslog)
``Jan 15 10:23:45[.123456] host tag:`` (RFC 3164,   ``--year`` (UTC); month in ``LC_TIME``'s
journalctl ``short``, ``short-precise``)            language
``Mon 2024-01-15 10:23:45 UTC host tag:``           itself; a zone abbreviation other than UTC
(journalctl ``short-full``)                         must be ``--timezone``'s
``1705314225.123456 host tag:`` (``short-unix``)    itself
``<4>1 2024-01-15T10:23:45Z host app - - [sd]``     itself
(RFC 5424)
nothing (``dmesg -t``, journalctl ``cat``)          cannot be placed
==================================================  ===========================================

``dmesg -x`` / ``--decode`` puts ``kern  :warn  : `` in front of any of the dmesg shapes.

A reason is a :class:`FileCause` when the cause is the file, not the line (plain ``dmesg``
without ``--boot-time``, a syslog without ``--year``, no time stamp at all, a month name of an
unknown language): the parser then reports it once per file instead of once per line.

Month names: the abbreviations (``abmon``, and ``ab_alt_mon`` where it differs) of glibc's
locales for the languages below, matched case-insensitively with or without their trailing dot;
``tests/unit/stream/inputs/parsers/test_kernel_times.py`` checks them against glibc's locale
sources when the machine has them.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Final
from zoneinfo import ZoneInfo

from stream.inputs.parsers.options import ParseOptions

__all__ = ["MONTH_ABBREVIATIONS", "FileCause", "KernelTimes", "month_number"]


class FileCause(str):
    """A reason that is the file's, not the line's: reported once per file."""

    __slots__ = ()


#: Month abbreviations by glibc locale (``abmon``; Russian also ``ab_alt_mon``), January first.
MONTH_ABBREVIATIONS: Final[dict[str, tuple[str, ...]]] = {
    "en_US": ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"),
    "de_DE": ("Jan", "Feb", "Mär", "Apr", "Mai", "Jun", "Jul", "Aug", "Sep", "Okt", "Nov", "Dez"),
    "fr_FR": ("janv.", "févr.", "mars", "avril", "mai", "juin", "juil.", "août", "sept.", "oct.", "nov.",
              "déc."),
    "es_ES": ("ene", "feb", "mar", "abr", "may", "jun", "jul", "ago", "sep", "oct", "nov", "dic"),
    "it_IT": ("gen", "feb", "mar", "apr", "mag", "giu", "lug", "ago", "set", "ott", "nov", "dic"),
    "pt_BR": ("jan", "fev", "mar", "abr", "mai", "jun", "jul", "ago", "set", "out", "nov", "dez"),
    "nl_NL": ("jan", "feb", "mrt", "apr", "mei", "jun", "jul", "aug", "sep", "okt", "nov", "dec"),
    "pl_PL": ("sty", "lut", "mar", "kwi", "maj", "cze", "lip", "sie", "wrz", "paź", "lis", "gru"),
    "cs_CZ": ("led", "úno", "bře", "dub", "kvě", "čen", "čec", "srp", "zář", "říj", "lis", "pro"),
    "sk_SK": ("jan", "feb", "mar", "apr", "máj", "jún", "júl", "aug", "sep", "okt", "nov", "dec"),
    "hu_HU": ("jan", "febr", "márc", "ápr", "máj", "jún", "júl", "aug", "szept", "okt", "nov", "dec"),
    "ro_RO": ("ian", "feb", "mar", "apr", "mai", "iun", "iul", "aug", "sep", "oct", "nov", "dec"),
    "sv_SE": ("jan", "feb", "mar", "apr", "maj", "jun", "jul", "aug", "sep", "okt", "nov", "dec"),
    "da_DK": ("jan", "feb", "mar", "apr", "maj", "jun", "jul", "aug", "sep", "okt", "nov", "dec"),
    "nb_NO": ("jan.", "feb.", "mars", "april", "mai", "juni", "juli", "aug.", "sep.", "okt.", "nov.", "des."),
    "fi_FI": ("tammi", "helmi", "maalis", "huhti", "touko", "kesä", "heinä", "elo", "syys", "loka", "marras",
              "joulu"),
    "tr_TR": ("Oca", "Şub", "Mar", "Nis", "May", "Haz", "Tem", "Ağu", "Eyl", "Eki", "Kas", "Ara"),
    "ru_RU": ("янв", "фев", "мар", "апр", "мая", "июн", "июл", "авг", "сен", "окт", "ноя", "дек"),
    "ru_RU alt": ("янв", "фев", "мар", "апр", "май", "июн", "июл", "авг", "сен", "окт", "ноя", "дек"),
    "uk_UA": ("січ", "лют", "бер", "кві", "тра", "чер", "лип", "сер", "вер", "жов", "лис", "гру"),  # noqa: RUF001
}  # fmt: skip


def _month_table() -> dict[str, int]:
    table: dict[str, int] = {}
    for names in MONTH_ABBREVIATIONS.values():
        for number, name in enumerate(names, 1):
            key = name.casefold().rstrip(".")
            # Two languages never give one abbreviation two months (a test holds the table to it).
            assert table.setdefault(key, number) == number, name
    return table


_MONTHS: Final = _month_table()
# Chinese, Japanese and Korean print the number and 月 / 월 (" 1月").
_CJK_MONTH_RE: Final = re.compile(r"(\d{1,2})[月월]")


def month_number(token: str) -> int | None:
    """Return 1-12 for a month abbreviation of any known locale, else None.

    >>> month_number("Mär"), month_number("janv."), month_number("PAŹ"), month_number("10月")
    (3, 1, 10, 10)
    """
    number = _MONTHS.get(token.casefold().rstrip("."))
    if number is not None:
        return number
    match = _CJK_MONTH_RE.fullmatch(token.strip())
    if match is not None and 1 <= int(match[1]) <= 12:
        return int(match[1])
    return None


_PRI: Final = r"(?:<\d{1,3}>)?"
# ``dmesg -x``: facility and level, padded (``kern  :warn  : ``).
_DECODE: Final = r"(?:[a-z][a-z0-9]{1,8}\s*:\s*(?:emerg|alert|crit|err|warn|notice|info|debug)\s*:\s*)?"
# ``dmesg -d`` adds `` <    0.000123>`` inside the brackets.
_UPTIME: Final = r"\[\s*(?P<up>\d+\.\d+)(?:\s*<\s*\d+\.\d+\s*>)?\s*\]"
_HOST_TAG: Final = r"(?P<host>\S+)\s+(?P<tag>[^\s:\[]+)(?:\[\d+\])?:"
# A month abbreviation: letters and an optional dot, or CJK's number and 月.
_MON: Final = r"(?P<mon>[^\W\d_]{2,7}\.?|\d{1,2}[月월])"
_HMS: Final = r"(?P<hh>\d{1,2}):(?P<mm>\d{2}):(?P<ss>\d{2})"

_DMESG_RE: Final = re.compile(rf"^\s*{_PRI}{_DECODE}{_UPTIME}\s*(?:{_HOST_TAG}\s*)?$")
_DMESG_T_RE: Final = re.compile(
    rf"^\s*{_PRI}{_DECODE}\[\s*\S+\s+{_MON}\s+(?P<day>\d{{1,2}})\s+{_HMS}\s+(?P<year>\d{{4}})\s*\]\s*$"
)
_RELTIME_RE: Final = re.compile(
    rf"^\s*{_PRI}{_DECODE}\[(?:\s*\+\s*(?P<delta>\d+\.\d+)|{_MON}\s*(?P<day>\d{{1,2}})\s+(?P<hh>\d{{1,2}}):(?P<mm>\d{{2}}))\]"
)
_RFC3164_RE: Final = re.compile(
    rf"^\s*{_PRI}{_MON}\s+(?P<day>\d{{1,2}})\s+{_HMS}(?:\.(?P<frac>\d{{1,9}}))?\s+"
    rf"{_HOST_TAG}\s*(?:{_UPTIME}\s*)?$"
)
_ISO: Final = r"(?P<iso>\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:Z|[+-]\d{2}(?::?\d{2})?)?)"
_ISO_RE: Final = re.compile(rf"^\s*{_PRI}{_DECODE}{_ISO}\s+(?:{_HOST_TAG}\s*)?(?:{_UPTIME}\s*)?$")
_FULL_RE: Final = re.compile(
    r"^\s*\S+\s+(?P<date>\d{4}-\d{2}-\d{2})\s+(?P<time>\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?)\s+"
    rf"(?P<tz>[A-Za-z]{{1,6}}|[+-]\d{{2}}(?::?\d{{2}})?)\s+{_HOST_TAG}\s*(?:{_UPTIME}\s*)?$"
)
_UNIX_RE: Final = re.compile(rf"^\s*(?P<unix>\d{{9,11}}(?:\.\d{{1,9}})?)\s+{_HOST_TAG}\s*(?:{_UPTIME}\s*)?$")
_RFC5424_RE: Final = re.compile(
    r"^\s*<\d{1,3}>1\s+(?P<ts>\S+)\s+(?P<host>\S+)\s+(?P<app>\S+)\s+\S+\s+\S+\s+"
    r"(?P<sd>-|(?:\[(?:[^\]\"\\]|\\.|\"(?:[^\"\\]|\\.)*\")*\])+)\s*\ufeff?\s*"
    rf"(?:{_UPTIME}\s*)?$"
)
# Only the decode prefix, or nothing at all: ``dmesg -t`` / ``-x -t``, ``journalctl -o cat``.
_NO_TIME_RE: Final = re.compile(rf"^\s*{_PRI}{_DECODE}$")
# A host and tag with no time: what ``journalctl -o cat`` never prints, but a pasted syslog
# line cut at the start does.
_HOST_ONLY_RE: Final = re.compile(rf"^\s*{_HOST_TAG}\s*$")

_EPOCH_NAIVE: Final = datetime(1970, 1, 1)
_ONE_MS: Final = timedelta(milliseconds=1)
_UTC_NAMES: Final = frozenset({"UTC", "GMT", "UT", "Z"})


def _uptime_us(text: str) -> int:
    seconds, _, fraction = text.partition(".")
    return int(seconds) * 1_000_000 + int((fraction + "000000")[:6])


def _frac_ms(frac: str | None) -> int:
    if not frac:
        return 0
    return round(int((frac + "000000")[:6]) / 1000)


def iso_ms(text: str) -> int:
    """Epoch ms of an ISO 8601 time (a decimal comma allowed); no offset means UTC.

    Raises
    ------
    ValueError
        If ``text`` is not a valid time.

    >>> iso_ms("2025-01-21T04:41:44,283302+00:00")
    1737434504283
    """
    parsed = datetime.fromisoformat(text.replace(",", ".", 1))
    if parsed.tzinfo is None:
        return round((parsed - _EPOCH_NAIVE) / _ONE_MS)
    return round(parsed.timestamp() * 1000)


#: What :meth:`KernelTimes.prefix` returns: the time and the host the prefix names, or a reason.
Stamp = tuple[int, str | None] | str


class KernelTimes:
    """Per-file state of time stamp conversion: the year roll-over of year-less stamps and the
    running minute of ``dmesg --reltime``.

    Parameters
    ----------
    options
        ``year``, ``boot_time_ms`` and ``timezone`` are used.
    """

    __slots__ = (
        "boot_time_ms",
        "last_month",
        "rel_delta_us",
        "rel_minute_ms",
        "timezone_name",
        "year",
        "zone",
    )

    def __init__(self, options: ParseOptions) -> None:
        self.year = options.year
        self.boot_time_ms = options.boot_time_ms
        self.zone: ZoneInfo = options.zone()
        self.timezone_name = options.timezone
        self.last_month = 0
        # dmesg --reltime: the minute of the last ``[Jan15 10:23]`` line and the deltas since.
        self.rel_minute_ms: int | None = None
        self.rel_delta_us = 0

    def observe(self, line: bytes) -> None:
        """Follow ``dmesg --reltime`` stamps on every line, relevant or not (deltas add up).

        Cheap for other files: only a line with ``[`` followed by a letter (a minute stamp), or
        with a ``+`` delta once a minute stamp was seen, is matched.
        """
        head = line[:48]
        bracket = head.find(b"[")
        if bracket < 0:
            return
        after = head[bracket + 1 : bracket + 2]
        if not (after.isalpha() or after >= b"\x80" or (self.rel_minute_ms is not None and b"+" in head)):
            return
        match = _RELTIME_RE.match(head.decode("utf-8", "replace"))
        if match is None:
            return
        if match["delta"] is not None:
            self.rel_delta_us += _uptime_us(match["delta"])
            return
        self._reltime_anchor(match)

    def _reltime_anchor(self, match: re.Match[str]) -> str | None:
        month = month_number(match["mon"])
        if month is None:
            return FileCause(f"bad month {match['mon']!r} in dmesg --reltime time stamp")
        if self.year is None:
            return FileCause("dmesg --reltime time stamp has no year: pass --year")
        year = self._roll(month)
        try:
            day, hour, minute = int(match["day"]), int(match["hh"]), int(match["mm"])
            moment = datetime(year, month, day, hour, minute, tzinfo=self.zone)
        except ValueError as exc:
            return f"bad dmesg --reltime time stamp: {exc}"
        self.rel_minute_ms = round(moment.timestamp() * 1000)
        self.rel_delta_us = 0
        return None

    def _roll(self, month: int) -> int:
        """The year of a year-less stamp: ``year``, plus one each time the month jumps back > 6."""
        assert self.year is not None
        if self.last_month and month < self.last_month - 6:
            self.year += 1
        self.last_month = month
        return self.year

    def prefix(self, prefix: str) -> Stamp:
        """Return ``(ts_ms, host or None)`` from the text before the driver's message, or a reason."""
        match = _DMESG_RE.match(prefix)
        if match is not None:
            if self.boot_time_ms is None:
                return FileCause(
                    "plain dmesg time stamp counts seconds since boot: pass --boot-time "
                    "(the node's boot time) to place it"
                )
            return self.boot_time_ms + (_uptime_us(match["up"]) + 500) // 1000, match["host"]
        match = _DMESG_T_RE.match(prefix)
        if match is not None:
            return self._dmesg_t(match)
        match = _RFC3164_RE.match(prefix)
        if match is not None:
            return self._rfc3164(match)
        match = _ISO_RE.match(prefix)
        if match is not None:
            try:
                return iso_ms(match["iso"]), match["host"]
            except ValueError:
                return f"bad time stamp {match['iso']!r}"
        match = _RFC5424_RE.match(prefix)
        if match is not None:
            host = match["host"]
            if match["ts"] == "-":
                return "RFC 5424 record has no time stamp (NILVALUE '-')"
            try:
                return iso_ms(match["ts"]), None if host == "-" else host
            except ValueError:
                return f"bad RFC 5424 time stamp {match['ts']!r}"
        match = _RELTIME_RE.match(prefix)
        if match is not None and match.end() == len(prefix.rstrip()):
            return self._reltime(match)
        match = _FULL_RE.match(prefix)
        if match is not None:
            return self._short_full(match)
        match = _UNIX_RE.match(prefix)
        if match is not None:
            return round(float(match["unix"]) * 1000), match["host"]
        if _NO_TIME_RE.match(prefix) is not None or _HOST_ONLY_RE.match(prefix) is not None:
            return FileCause(
                "line has no time stamp (dmesg -t / --time-format notime, journalctl -o cat?): it cannot "
                "be placed in time; export with time stamps (dmesg -T or --time-format iso, journalctl "
                "-o short-iso)"
            )
        return "unrecognised time stamp or syslog header before the driver's message"

    def _reltime(self, match: re.Match[str]) -> Stamp:
        if match["delta"] is None:
            reason = self._reltime_anchor(match)
            if reason is not None:
                return reason
        elif self.rel_minute_ms is None:
            if self.year is None:
                return FileCause("dmesg --reltime time stamp has no year: pass --year")
            return FileCause(
                "dmesg --reltime delta with no '[Mon DD HH:MM]' line before it: the file was cut; "
                "it cannot be placed in time"
            )
        assert self.rel_minute_ms is not None
        # util-linux prints a new minute line when the minute changes, so the deltas since the
        # last one stay inside its minute: clamp what rounding or a missed line could push over.
        offset_ms = min(self.rel_delta_us // 1000, 59_999)
        return self.rel_minute_ms + offset_ms, None

    def _dmesg_t(self, match: re.Match[str]) -> Stamp:
        month = month_number(match["mon"])
        if month is None:
            return FileCause(f"bad month {match['mon']!r} in dmesg -T time stamp (unknown language)")
        try:
            moment = datetime(
                int(match["year"]),
                month,
                int(match["day"]),
                int(match["hh"]),
                int(match["mm"]),
                int(match["ss"]),
                tzinfo=self.zone,
            )
        except ValueError as exc:
            return f"bad dmesg -T time stamp: {exc}"
        return round(moment.timestamp() * 1000), None

    def _rfc3164(self, match: re.Match[str]) -> Stamp:
        month = month_number(match["mon"])
        if month is None:
            return FileCause(f"bad month {match['mon']!r} in syslog time stamp (unknown language)")
        if self.year is None:
            return FileCause("syslog/journalctl time stamp has no year: pass --year")
        year = self._roll(month)
        try:
            day, hour, minute, second = (
                int(match["day"]),
                int(match["hh"]),
                int(match["mm"]),
                int(match["ss"]),
            )
            moment = datetime(year, month, day, hour, minute, second)
        except ValueError as exc:
            return f"bad syslog time stamp: {exc}"
        return round((moment - _EPOCH_NAIVE) / _ONE_MS) + _frac_ms(match["frac"]), match["host"]

    def _short_full(self, match: re.Match[str]) -> Stamp:
        """journalctl ``short-full``: ``Mon 2024-01-15 10:23:45 CET``; the zone is an abbreviation."""
        tz = match["tz"]
        text = f"{match['date']}T{match['time']}"
        try:
            if tz.upper() in _UTC_NAMES:
                return iso_ms(text + "+00:00"), match["host"]
            if tz[0] in "+-":
                return iso_ms(text + tz), match["host"]
            naive = datetime.fromisoformat(text)
        except ValueError:
            return f"bad journalctl short-full time stamp {text!r}"
        local = naive.replace(tzinfo=self.zone)
        if local.tzname() != tz:
            return FileCause(
                f"time zone {tz!r} of a journalctl short-full time stamp is not --timezone "
                f"{self.timezone_name!r}'s abbreviation then ({local.tzname()}): pass --timezone with the "
                "node's IANA zone"
            )
        return round(local.timestamp() * 1000), match["host"]
