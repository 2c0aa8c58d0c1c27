"""Options shared by every input parser, and the helpers that apply them.

The parsers turn operator files (kernel logs, ``sacct -P`` output, DCGM exporter scrapes,
``nvidia-smi -q`` dumps, JSON Lines) into the typed records of :mod:`schemas.records`.
What a file does not say (the cluster, the year of a syslog time, the boot time of a plain
``dmesg``) comes from :class:`ParseOptions`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import PurePath
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from schemas.records import InvalidRecord

__all__ = ["Format", "ParseOptions", "default_node", "invalid", "strip_eol"]


class Format(StrEnum):
    """The input formats that :func:`stream.inputs.parsers.parse_file` reads."""

    KERNEL = "kernel"
    SACCT = "sacct"
    DCGM = "dcgm"
    NVIDIA_SMI = "nvidia-smi"
    JSONL = "jsonl"


@dataclass(frozen=True, slots=True)
class ParseOptions:
    """What the parsers need to know that the input itself may not say.

    Attributes
    ----------
    cluster
        Cluster name stamped on every record (sacct's ``Cluster`` column wins when present,
        and so does a JSON record's own ``cluster``).
    node
        Node name when a line carries no host; else the file name's stem is used
        (``node017.dmesg.gz`` -> ``node017``).
    year
        Year of timestamps printed without one (syslog RFC 3164, ``journalctl`` short). ``None``
        dead-letters such lines with a reason that says to pass ``--year``.
    boot_time_ms
        Wall-clock boot time (epoch ms) for plain ``dmesg`` lines, which count seconds since
        boot. ``None`` dead-letters them with a reason that says to pass ``--boot-time``.
    scrape_time_ms
        Time (epoch ms) of DCGM samples that carry no timestamp. ``None`` dead-letters them.
    gpus_per_node
        GPU count per node of a job when sacct gives no ``gres/gpu``.
    timezone
        IANA zone name of sacct's naive timestamps, ``dmesg -T`` and ``nvidia-smi -q``.

    Raises
    ------
    ValueError
        If ``timezone`` is not a known zone or ``gpus_per_node`` is negative.
    """

    cluster: str = "default"
    node: str | None = None
    year: int | None = None
    boot_time_ms: int | None = None
    scrape_time_ms: int | None = None
    gpus_per_node: int = 8
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        if self.gpus_per_node < 0:
            raise ValueError(f"gpus_per_node must be >= 0, got {self.gpus_per_node}")
        self.zone()

    def zone(self) -> ZoneInfo:
        """Return the :class:`~zoneinfo.ZoneInfo` of :attr:`timezone`.

        >>> ParseOptions(timezone="Europe/Paris").zone().key
        'Europe/Paris'
        """
        try:
            return ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {self.timezone!r} (use an IANA name like 'UTC')") from None


def default_node(options: ParseOptions, source: str) -> str:
    """Return the node name to use when a record names none.

    Parameters
    ----------
    options
        ``options.node`` wins when set.
    source
        The file path; its name up to the first dot is the fallback.

    Returns
    -------
    str
        The node name, or ``""`` when neither gives one.

    >>> default_node(ParseOptions(), "/var/log/node017.dmesg.gz")
    'node017'
    >>> default_node(ParseOptions(node="gpu3"), "/var/log/node017.log")
    'gpu3'
    """
    if options.node:
        return options.node
    return PurePath(source).name.split(".", 1)[0] if source else ""


def strip_eol(line: bytes) -> bytes:
    r"""Return ``line`` without its ``\n`` or ``\r\n`` terminator.

    >>> strip_eol(b"abc\r\n")
    b'abc'
    """
    if line.endswith(b"\n"):
        line = line[:-1]
    if line.endswith(b"\r"):
        line = line[:-1]
    return line


def invalid(reason: str, raw: bytes, source: str, line_no: int) -> InvalidRecord:
    """Build the dead letter of the record that starts at ``line_no`` (1-based) of ``source``."""
    return InvalidRecord(reason, raw=raw, source=source, location=f"line {line_no}")
