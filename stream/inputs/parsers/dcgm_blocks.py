"""DCGM exporter scrapes read a block of lines at a time: :func:`~stream.inputs.parsers.dcgm.parse_dcgm`'s
items, item for item, at the speed of the data.

A dcgm-exporter scrape is mostly series we do not read (clocks, temperatures, utilisation …) and,
of those we read, runs of one metric over every GPU, one line each, alike but for the values. So
a block of whole lines is read in three steps, each over many lines in C:

1. the next line that starts with a read metric name (``DCGM_FI_DEV_ECC_…``, ``…_XID_ERRORS`` …)
   is found with one regular expression over the block: the lines before it cost no Python;
2. the run of lines of that metric that follow is cut out (another expression finds its end) and
   checked to be plain: ``NAME{LABELS} VALUE TIMESTAMP`` on every line, each with exactly one
   ``{``, one ``}``, then `` DIGITS DIGITS`` (a ``bytes.translate`` skeleton of the
   run compared with the expected one), all with the same time stamp. A plain run is split into
   its labels, values and time stamps by a few ``bytes`` methods, and its GPUs looked up by label
   set in a cache;
3. a scrape whose runs all list the same GPUs in the same order (the exporter's layout) is kept as
   columns, one per metric, and turned into its samples at the end of the scrape in one pass.

Anything else — a run that is not plain (a dead letter, a blank sentinel, escaped labels, a line
without time stamp), GPUs listed differently by two metrics — is read line by line by
:class:`~stream.inputs.parsers.dcgm.DcgmState`, the reference, from that point of the scrape on.
The unit tests compare both readings on tricky inputs; a run read in bulk is exactly one the
reference reads the same way.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Iterator, Sequence
from itertools import chain, repeat
from operator import itemgetter
from typing import IO, Final

from schemas.records import EccSample, InvalidRecord
from stream.inputs.parsers.dcgm import _INT32_BLANK, _WANTED, DcgmItem, DcgmState
from stream.inputs.parsers.options import ParseOptions

__all__ = ["BLOCK_BYTES", "READ_NAMES", "RUN_END", "DcgmBlockParser", "parse_dcgm_file"]

#: Bytes read at a time from a plain file (then cut after its last whole line).
BLOCK_BYTES: Final = 1 << 20

#: The metric names we read, longest first.
READ_NAMES: Final = sorted(_WANTED, key=len, reverse=True)
# A line that starts with a read metric name (the newline before it included).
_CANDIDATE: Final = re.compile(b"\n(?:" + b"|".join(re.escape(name) for name in READ_NAMES) + b")")
#: Per read metric, the newline ending a run of its lines: the first one not followed by ``NAME{``.
RUN_END: Final = {name: re.compile(b"\n(?!" + re.escape(name) + b"\\{)") for name in READ_NAMES}
_NOT_SKELETON: Final = bytes(byte for byte in range(256) if byte not in b"{}\n")
_BRACES_TO_NEWLINES: Final = bytes.maketrans(b"{}", b"\n\n")
_DIGITS: Final = b"0123456789"
_OPEN_BRACE: Final = ord("{")
#: Label sets cached for the bulk reading (a 16,384-node fleet has 131,072); more clears the cache.
_BULK_LABEL_LIMIT: Final = 1 << 20

_Labels = tuple[str, int, str]


class _Metric:
    """One metric's column of a columnar scrape: its values and the lines they were read from."""

    __slots__ = ("counter", "lines", "values")

    def __init__(self, counter: str, values: list[int], lines: range) -> None:
        self.counter = counter  # "" for the XID metric
        self.values = values
        self.lines = [lines]  # consecutive lines per run

    def line_numbers(self) -> range | list[int]:
        return self.lines[0] if len(self.lines) == 1 else list(chain.from_iterable(self.lines))


class _Columns:
    """A scrape read so far as columns: every metric lists the GPUs of the first one (``labels``,
    in file order), one value each; the last metric may still be growing."""

    __slots__ = ("labels", "metrics", "ts_ms")

    def __init__(self, ts_ms: int, labels: list[_Labels], first: _Metric) -> None:
        self.ts_ms = ts_ms
        self.labels = labels
        self.metrics = [first]

    def add(self, counter: str, labels: list[_Labels], values: list[int], lines: range) -> bool:
        """Add a run of ``counter``'s lines; False when it does not fit the columns."""
        last = self.metrics[-1]
        if counter == last.counter:  # the run goes on (it was cut by a block's end or a comment)
            if len(self.metrics) == 1:
                self.labels.extend(labels)
            else:
                done = len(last.values)
                if self.labels[done : done + len(labels)] != labels:
                    return False
            last.values.extend(values)
            last.lines.append(lines)
            return True
        if any(metric.counter == counter for metric in self.metrics) or self.labels[: len(labels)] != labels:
            return False
        self.metrics.append(_Metric(counter, values, lines))
        return True

    def complete(self) -> bool:
        """Whether every metric has a value for every GPU."""
        size = len(self.labels)
        return all(len(metric.values) == size for metric in self.metrics)


class DcgmBlockParser(DcgmState):
    """Read one DCGM input in blocks of whole lines; the items of ``parse_dcgm`` over its lines.

    Parameters
    ----------
    options, source
        As for :func:`~stream.inputs.parsers.dcgm.parse_dcgm`.
    first_line
        The number of the first line fed (a part of a file begins after line 1).
    part
        Read a part of a file that begins with a scrape (see :class:`DcgmState`).
    """

    def __init__(
        self, options: ParseOptions, source: str, *, first_line: int = 1, part: bool = False
    ) -> None:
        super().__init__(options, source, part=part)
        self.line_no = first_line  # number of the next line fed
        self.columns: _Columns | None = None
        self._bulk_labels: dict[bytes, _Labels] = {}
        # The GPU lists of the last columnar scrape, checked free of duplicates, and their sort order.
        self._checked: list[_Labels] | None = None
        self._order: list[int] | None = None
        self._gpu_keys: set[tuple[str, int]] = set()

    # -- the reference's hooks -------------------------------------------------------------------

    def apply(self, ts_ms: int, labels: _Labels, counter: str, value: int, line_no: int) -> None:
        if self.columns is not None:
            self._to_groups()
        super().apply(ts_ms, labels, counter, value, line_no)

    def flush(self, out: list[DcgmItem]) -> None:
        if self.columns is not None:
            self._flush_columns(out)
        else:
            super().flush(out)

    # -- blocks ----------------------------------------------------------------------------------

    def feed(self, block: bytes, out: list[DcgmItem]) -> None:
        """Read ``block``: whole lines, the last one ending with a newline."""
        if block and not block.endswith(b"\n"):
            raise ValueError("a block must end with a newline (whole lines)")
        buf = b"\n" + block
        line_no = self.line_no
        counted = 0  # buf[counted] is the newline before line ``line_no``
        position = 0
        search = _CANDIDATE.search
        while (found := search(buf, position)) is not None:
            at = found.start()
            line_no += buf.count(b"\n", counted, at)
            counted = at
            name = found.group()[1:]
            start = at + 1
            if buf[start + len(name)] == _OPEN_BRACE:
                end = RUN_END[name].search(buf, start).start()  # type: ignore[union-attr]  # the last newline
                lines = self._run(name, buf, start, end + 1, line_no, out)
            else:
                end = buf.index(b"\n", start)
                self.line(buf[start:end], line_no, out)
                lines = 1
            line_no += lines
            counted = position = end
        self.line_no = line_no + buf.count(b"\n", counted) - 1

    def _run(self, name: bytes, buf: bytes, start: int, end: int, line_no: int, out: list[DcgmItem]) -> int:
        """Read the lines ``buf[start:end]``, all beginning ``NAME{``; return how many."""
        run = buf[start:end]
        skeleton = run.translate(None, _NOT_SKELETON)
        count = len(skeleton) // 3
        if skeleton == b"{}\n" * count:
            pieces = run.translate(_BRACES_TO_NEWLINES).split(b"\n")
            # Every tail (after the labels) is " DIGITS DIGITS": a space first, one more space, digits
            # around it, and two tokens each.
            tails = b"\n".join(pieces[2::3])
            tokens = tails.split()
            if (
                len(tokens) == 2 * count
                and tails.startswith(b" ")
                and tails.count(b"\n ") == count - 1
                and tails.translate(None, _DIGITS) == b"  \n" * (count - 1) + b"  "
            ):
                stamps = tokens[1::2]
                if stamps.count(stamps[0]) == count:
                    values = list(map(int, tokens[0::2]))
                    if max(values) < _INT32_BLANK and self._bulk(
                        name, pieces[1::3], values, int(stamps[0]), line_no, out
                    ):
                        return count
        lines = run.split(b"\n")
        lines.pop()
        for offset, line in enumerate(lines):
            self.line(line, line_no + offset, out)
        return len(lines)

    def _bulk(
        self,
        name: bytes,
        label_bytes: list[bytes],
        values: list[int],
        ts_ms: int,
        line_no: int,
        out: list[DcgmItem],
    ) -> bool:
        """Add a plain run to the scrape as a column; False (nothing done) when it must go line by line."""
        cache = self._bulk_labels
        labels = list(map(cache.get, label_bytes))
        if None in labels:
            if len(cache) + len(labels) > _BULK_LABEL_LIMIT:
                cache.clear()
            for index, known in enumerate(labels):
                if known is None:
                    parsed = self.labels(label_bytes[index])
                    if isinstance(parsed, str):
                        return False  # a dead letter: the reference says it in its place
                    labels[index] = cache[label_bytes[index]] = parsed
        counter = _WANTED[name]
        self.begin(name, out)
        lines = range(line_no, line_no + len(values))
        columns = self.columns
        if columns is None and not self.groups:
            self.columns = _Columns(ts_ms, labels, _Metric(counter, values, lines))  # type: ignore[arg-type]
        elif columns is None or columns.ts_ms != ts_ms or not columns.add(counter, labels, values, lines):  # type: ignore[arg-type]
            for labels_of, value, line in zip(labels, values, lines, strict=True):
                self.apply(ts_ms, labels_of, counter, value, line)  # type: ignore[arg-type]
        return True

    def _distinct(self, labels: list[_Labels]) -> bool:
        """Whether a scrape's GPU list names each (node, GPU) once (each line its own sample);
        remembers the list's sort order."""
        if labels == self._checked:
            return True
        keys = {(node, gpu) for node, gpu, _ in labels}
        if len(keys) != len(labels):
            return False
        self._checked = list(labels)
        self._gpu_keys = keys
        order = sorted(range(len(labels)), key=lambda index: (labels[index][0], labels[index][1]))
        self._order = None if order == list(range(len(labels))) else order
        return True

    def _to_groups(self) -> None:
        """Hand the columns to the reference's groups, line by line in the order they were read."""
        columns = self.columns
        assert columns is not None
        self.columns = None
        ts_ms = columns.ts_ms
        apply = super().apply
        for metric in columns.metrics:
            for labels, value, line in zip(
                columns.labels, metric.values, metric.line_numbers(), strict=False
            ):
                apply(ts_ms, labels, metric.counter, value, line)

    def _flush_columns(self, out: list[DcgmItem]) -> None:
        columns = self.columns
        assert columns is not None
        if not columns.complete() or not self._distinct(columns.labels):
            self._to_groups()
            super().flush(out)
            return
        self.columns = None
        labels = columns.labels
        counters = [metric for metric in columns.metrics if metric.counter]
        xid = next((metric for metric in columns.metrics if not metric.counter), None)
        samples: list[dict[str, int]] | None = None
        lines: Sequence[int] = range(0)
        if counters:
            names = [metric.counter for metric in counters]
            samples = list(
                map(dict, map(zip, repeat(names), zip(*(metric.values for metric in counters), strict=True)))
            )
            lines = counters[0].line_numbers()
        xids: Sequence[int] | None = None
        xid_lines: Sequence[int] = range(0)
        if xid is not None:
            xids, xid_lines = xid.values, xid.line_numbers()
        order = self._order
        if order is not None:
            pick = itemgetter(*order) if len(order) > 1 else _first
            labels = pick(labels)
            lines = pick(lines)
            if samples is not None:
                samples = pick(samples)
            if xids is not None:
                xids, xid_lines = pick(xids), pick(xid_lines)
        ts_ms = columns.ts_ms
        built: list[EccSample] | None = None
        if samples is not None:
            cluster = self.cluster
            prefix = f"{self.source}:"
            built = [
                EccSample(
                    ts_ms=ts_ms,
                    cluster=cluster,
                    node=node,
                    gpu=gpu,
                    pci_bus_id=pci,
                    counters=counters_of,
                    source=prefix + str(line),
                )
                for (node, gpu, pci), counters_of, line in zip(labels, samples, lines, strict=True)
            ]
        if xids is not None:
            if any(xids):  # each GPU's event (if any) before its sample
                for index, (node, gpu, pci) in enumerate(labels):
                    self.xid(ts_ms, node, gpu, pci, xids[index], xid_lines[index], out)
                    if built is not None:
                        out.append(built[index])
                return
            # No GPU reports a code: no event, and each GPU's last value is 0, read now.
            if self.part:
                self.xid_seen.update(self._gpu_keys)
            self.last_xid.update(dict.fromkeys(self._gpu_keys, (0, ts_ms)))
        if built is not None:
            out.extend(built)


def _first(sequence: Sequence[object]) -> tuple[object, ...]:
    return (sequence[0],)


def parse_dcgm_file(handle: IO[bytes], options: ParseOptions, source: str) -> Iterator[DcgmItem]:
    """Parse an open DCGM file (plain or gzip) in blocks; the items ``parse_dcgm`` gives over its lines.

    A gzip stream that ends early or is corrupt yields, after the records read before the damage,
    the dead letter :func:`stream.inputs.parsers.parse_open_file` makes of it.
    """
    parser = DcgmBlockParser(options, source)
    out: list[DcgmItem] = []
    if isinstance(handle, gzip.GzipFile):
        yield from _gzip_blocks(handle, parser, out, source)
        return
    rest = b""
    while data := handle.read(BLOCK_BYTES):
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            rest += data
            continue
        parser.feed(rest + data[:cut], out)
        rest = data[cut:]
        if out:
            yield from out
            out.clear()
    if rest:
        parser.feed(rest + b"\n", out)
    parser.finish(out)
    yield from out


def _gzip_blocks(
    handle: gzip.GzipFile, parser: DcgmBlockParser, out: list[DcgmItem], source: str
) -> Iterator[DcgmItem]:
    """A gzip file's lines in blocks; a damaged stream ends with a dead letter after its last line."""
    batch: list[bytes] = []
    size = 0
    count = 0
    error: Exception | None = None
    try:
        for line in handle:
            batch.append(line)
            size += len(line)
            if size >= BLOCK_BYTES:
                count += len(batch)
                parser.feed(b"".join(batch), out)
                batch.clear()
                size = 0
                if out:
                    yield from out
                    out.clear()
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        error = exc
    count += len(batch)
    if batch:
        block = b"".join(batch)
        parser.feed(block if block.endswith(b"\n") else block + b"\n", out)
    parser.finish(out)
    yield from out
    if error is not None:
        yield InvalidRecord(
            f"compressed input ends early or is corrupt ({error}); the records after it are lost",
            raw=b"",
            source=source,
            location=f"line {count + 1}",
        )
