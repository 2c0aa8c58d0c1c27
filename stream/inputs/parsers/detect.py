"""Format sniffing and transparent gzip reading of input files.

:func:`detect_format` looks at the content (the first 50 non-empty lines, at most 1 MiB), never
at the file name:

1. a first line that starts with ``{`` -> JSONL;
2. a first line that is a ``|``-separated header naming ``JobID`` and ``State`` -> SACCT;
3. a line starting with ``DCGM_FI_`` or ``# HELP DCGM`` / ``# TYPE DCGM`` -> DCGM;
4. a line containing ``NVSMI LOG`` or starting with ``Attached GPUs`` -> NVIDIA_SMI;
5. any other text -> KERNEL (kernel logs are mostly unrelated lines); an empty file too.

Binary content (NUL bytes, or bytes that are mostly not UTF-8) raises :class:`ValueError`.
"""

from __future__ import annotations

import gzip
import zlib
from io import BufferedReader
from pathlib import Path
from typing import Final

from stream.inputs.parsers.options import Format
from stream.inputs.parsers.sacct import read_sacct_header

__all__ = ["InputFile", "detect_format", "open_input"]

_GZIP_MAGIC: Final = b"\x1f\x8b"
_SNIFF_BYTES: Final = 1 << 20
_SNIFF_LINES: Final = 50
_SNIFF_CHUNK: Final = 1 << 16


#: A binary input file, plain or gzip.
InputFile = BufferedReader | gzip.GzipFile


def open_input(path: Path) -> InputFile:
    """Open ``path`` for binary reading, through gzip when its content is gzip.

    Parameters
    ----------
    path
        The file; gzip is recognised by its magic bytes, whatever the file is called.

    Returns
    -------
    InputFile
        A binary file object; iterating it yields lines split on ``\\n`` only.
    """
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == _GZIP_MAGIC:
        return gzip.open(path, "rb")
    return open(path, "rb")


def _sniff_lines(path: Path) -> list[bytes]:
    """The first non-empty lines (stripped), at most _SNIFF_LINES of them from _SNIFF_BYTES."""
    lines: list[bytes] = []
    size = 0
    with open_input(path) as handle:
        while len(lines) < _SNIFF_LINES and size < _SNIFF_BYTES:
            try:
                line = handle.readline(_SNIFF_CHUNK)
            except (EOFError, gzip.BadGzipFile, zlib.error):
                break  # a damaged gzip stream: sniff what came before; parse_file reports the damage
            if not line:
                break
            size += len(line)
            line = line.strip()
            if line:
                lines.append(line)
    return lines


def detect_format(path: Path) -> Format:
    """Return the format of an input file, sniffed from its content.

    Parameters
    ----------
    path
        The file to sniff (plain or gzip).

    Returns
    -------
    Format
        The detected format; an empty file is :attr:`Format.KERNEL` (it yields nothing).

    Raises
    ------
    ValueError
        If the content is binary, so no parser can read it.
    OSError
        If the file cannot be read (missing, not gzip despite its magic, ...).
    """
    lines = _sniff_lines(Path(path))
    if not lines:
        return Format.KERNEL
    first = lines[0]
    if first.startswith(b"{"):
        return Format.JSONL
    if b"|" in first and read_sacct_header(first) is not None:
        return Format.SACCT
    for line in lines:
        if line.startswith((b"DCGM_FI_", b"# HELP DCGM", b"# TYPE DCGM")):
            return Format.DCGM
    for line in lines:
        if b"NVSMI LOG" in line or line.startswith(b"Attached GPUs"):
            return Format.NVIDIA_SMI
    sample = b"\n".join(lines)
    if b"\x00" in sample or sample.decode("utf-8", "replace").count("\ufffd") > len(sample) // 10:
        raise ValueError(
            f"cannot detect the format of {path}: the content looks binary "
            f"(expected text: {', '.join(fmt.value for fmt in Format)}; compressed files must be gzip)"
        )
    return Format.KERNEL
