"""A large uncompressed DCGM file parsed in parts by several helper processes, merged back into the
items the file gives parsed whole, item for item.

The file is cut into parts of about ``part_bytes`` at scrape starts (:func:`part_bounds`): a line
of the file's first read metric whose previous line is not one, where the reading begins a new
scrape. Helper ``h`` of ``n`` (:mod:`stream.inputs.parse_ahead`) parses parts ``h``, ``h + n`` …
with :class:`~stream.inputs.parsers.dcgm_blocks.DcgmBlockParser` as a part (counting the lines of
the parts before its own, for the records' line numbers), and sends each part's items, then the
part's last scrape and where its reading ended (the metric met last, the families of its last
scrape, its samples without time stamps, each GPU's last XID value). :class:`ParsedInParts` takes
the parts in order:

* a part's first read line must start a scrape given where the part before ended (its metric
  differs from the last one read and its family was met in that scrape): then the part before's
  last scrape ends there too, as it did in the part. Should a file not keep the exporter's layout,
  the rest of the file is read again in process, from the start, the items already given skipped;
* a GPU's first XID code in a part is an event only if it differs from the GPU's last value
  before the part (:class:`~stream.inputs.parsers.dcgm.PendingXid`);
* the samples without a time stamp of all parts make one dead letter, at the end.

A part's items are queued by its helper (:class:`stream.inputs.parse_ahead._FrameWriter`), so the
helpers parse while the replay takes the parts before theirs.
"""

from __future__ import annotations

import dataclasses
import mmap
import re
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any, Final

from schemas.records import InvalidRecord, Record
from stream.inputs.parse_ahead import ParsedAhead, Segments, pack_items, unpack_items
from stream.inputs.parsers.dcgm import PendingXid, untimed_dead_letter
from stream.inputs.parsers.dcgm_blocks import (
    BLOCK_BYTES,
    READ_NAMES,
    RUN_END,
    DcgmBlockParser,
    parse_dcgm_file,
)
from stream.inputs.parsers.options import Format, ParseOptions

__all__ = ["ParsedInParts", "part_bounds", "serve_parts"]

#: Bytes a part, at least (a part holds whole scrapes: a 16,384-node fleet's is ~135 MB).
PART_BYTES: Final = 64 << 20
_FIRST_READ_LINE: Final = re.compile(
    b"(?:^|\n)(" + b"|".join(re.escape(name) for name in READ_NAMES) + b")[{]"
)
_COUNT_BYTES: Final = 64 << 20

#: Where a part's reading ended: (metric met last, families of its last scrape, its samples
#: without time stamps ``[first, last, count, raw]`` or None, each GPU's last XID value and its time).
PartEnd = tuple[bytes, set[bytes], list[Any] | None, dict[tuple[str, int], tuple[int, int]]]


def part_bounds(data: bytes | mmap.mmap, part_bytes: int) -> list[int]:
    """Offsets where parts begin, and the size at the end: 0, then scrape starts about
    ``part_bytes`` apart (a line of the first read metric whose previous line is not one)."""
    size = len(data)
    bounds = [0]
    first = _FIRST_READ_LINE.search(data)
    if first is not None:
        name = first.group(1)
        needle = b"\n" + name + b"{"
        for target in range(part_bytes, size, part_bytes):
            found = data.find(needle, max(target, bounds[-1]) - 1)
            while found >= 0:
                previous = data.rfind(b"\n", 0, found) + 1
                if data[previous : previous + len(needle) - 1] != needle[1:]:
                    break
                found = data.find(needle, RUN_END[name].search(data, found + 1).start())  # type: ignore[union-attr]
            if found < 0:
                break
            if found + 1 > bounds[-1]:
                bounds.append(found + 1)
    bounds.append(size)
    return bounds


def serve_parts(
    write: Callable[[str, int, Any], None],
    path: Path,
    options: ParseOptions,
    source: str,
    chunk_items: int,
    helper: int,
    helpers: int,
    part_bytes: int,
) -> None:
    """The helper's side: parse parts ``helper``, ``helper + helpers`` … of ``path`` and write their
    frames: ``"items"`` ``(first name, segments)``, ``"part"`` ``(first name, PartEnd, segments of
    its last scrape)``, then ``"end"``."""
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        bounds = part_bounds(data, part_bytes)
        counted_to, lines_before = 0, 0
        for part in range(helper, len(bounds) - 1, helpers):
            start, end = bounds[part], bounds[part + 1]
            for at in range(counted_to, start, _COUNT_BYTES):
                lines_before += data[at : min(at + _COUNT_BYTES, start)].count(b"\n")
            parser = DcgmBlockParser(options, source, first_line=lines_before + 1, part=True)
            out: list[Any] = []
            rest = b""  # a line cut by the block's end (parts begin and end with whole lines)
            for at in range(start, end, BLOCK_BYTES):
                stop = min(at + BLOCK_BYTES, end)
                block = rest + data[at:stop]
                cut = block.rfind(b"\n") + 1
                parser.feed(block[:cut], out)
                rest = block[cut:]
                if len(out) >= chunk_items:
                    write("items", stop, (parser.first_name, pack_items(out)))
                    out = []
            if rest:
                parser.feed(rest + b"\n", out)  # the file's last line, without its newline
            if out:
                write("items", end, (parser.first_name, pack_items(out)))
                out = []
            parser.flush(out)
            xids = {key: parser.last_xid[key] for key in parser.xid_seen}
            state: PartEnd = (parser.current_metric, set(parser.seen_metrics), parser.untimed, xids)
            write("part", end, (parser.first_name, state, pack_items(out)))
            counted_to, lines_before = end, parser.line_no - 1
    write("end", -1, None)


class ParsedInParts:
    """The items of one uncompressed DCGM file, parsed in parts by ``helpers`` processes; iterate once.

    The same items, in the same order, as :func:`~stream.inputs.parsers.parse_file` gives.
    """

    def __init__(
        self, path: Path, options: ParseOptions, source: str, helpers: int, part_bytes: int = PART_BYTES
    ) -> None:
        self.source = source
        self._path = path
        self._options = options
        self._parts = _parts(path, part_bytes)
        self._helpers = [
            ParsedAhead(path, Format.DCGM, options, source, parts=(helper, helpers, part_bytes))
            for helper in range(min(helpers, self._parts))
        ]
        self._done = False
        #: Parts whose reading did not join the one before (the rest was read again in process).
        self.rereads = 0

    def position(self) -> int:
        """Bytes of the file parsed so far; -1 once all of it."""
        if self._done:
            return -1
        return max((helper.position() for helper in self._helpers), default=0)

    def close(self) -> None:
        """Stop the helpers still running."""
        for helper in self._helpers:
            helper.close()

    def __iter__(self) -> Iterator[Record | InvalidRecord]:
        try:
            yield from self._merged()
        finally:
            self._done = True
            self.close()

    def _merged(self) -> Iterator[Record | InvalidRecord]:
        frames = [helper.frames() for helper in self._helpers]
        last_xid: dict[tuple[str, int], tuple[int, int]] = {}  # (value, time) of each GPU's field 230
        untimed: list[Any] | None = None
        ended: PartEnd | None = None  # where the reading of the parts so far ended
        held: list[Any] = []  # their last scrape: yielded once the next part is seen to start one
        given = 0
        for part in range(self._parts):
            stream = frames[part % len(frames)]
            joined = False
            for kind, payload in stream:
                first_name = payload[0]
                if not joined and first_name is not None:
                    if ended is not None and (first_name == ended[0] or first_name not in ended[1]):
                        self.close()
                        self.rereads += 1
                        yield from islice(self._in_process(), given, None)
                        return
                    joined = True
                    yield from held
                    given += len(held)
                    held = []
                if kind == "items":
                    items = self._resolved(payload[1], last_xid)
                    given += len(items)
                    yield from items
                    continue
                assert kind == "part", kind
                _, state, tail = payload
                if first_name is not None:  # a part without read lines leaves the reading as it was
                    held.extend(self._resolved(tail, last_xid))
                    ended = state
                    last_xid.update(state[3])
                    if state[2] is not None:
                        if untimed is None:
                            untimed = list(state[2])
                        else:
                            untimed[1] = state[2][1]
                            untimed[2] += state[2][2]
                break
        yield from held
        for stream in frames:
            kind, _ = next(stream)
            assert kind == "end", kind
        if untimed is not None:
            yield untimed_dead_letter(untimed, self.source)

    @staticmethod
    def _resolved(segments: Segments, last_xid: dict[tuple[str, int], tuple[int, int]]) -> list[Any]:
        """A part's items with its pending XIDs decided: an event, since the GPU's last sample before
        the part, where the code differs from its value there (they travel in the pickled segments,
        never in the samples')."""
        for index, segment in enumerate(segments):
            if type(segment) is list and any(type(item) is PendingXid for item in segment):
                decided = []
                for item in segment:
                    if type(item) is PendingXid:
                        event = item.event
                        previous, previous_ms = last_xid.get((event.node, event.gpu or 0), (0, 0))
                        if event.xid != previous:
                            decided.append(dataclasses.replace(event, since_ms=previous_ms))
                    else:
                        decided.append(item)
                segments[index] = decided
        return list(unpack_items(segments))

    def _in_process(self) -> Iterator[Any]:
        with self._path.open("rb") as handle:
            yield from parse_dcgm_file(handle, self._options, self.source)


def _parts(path: Path, part_bytes: int) -> int:
    """How many parts :func:`part_bounds` cuts the file into."""
    if path.stat().st_size == 0:
        return 1
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return len(part_bounds(data, part_bytes)) - 1
