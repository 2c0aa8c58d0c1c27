"""A large input file parsed in a helper process, ahead of the detection core that consumes it.

A replay is two jobs in turn on one core: parsing the operators' files (a DCGM scrape is about
five Prometheus lines a record) and running each record through the detection core. They need not
share a core. :class:`ParsedAhead` starts ``python -m stream.inputs.parse_ahead``, which parses
one file with the same parser (:func:`stream.inputs.parsers.parse_open_file`) and writes its
records and dead letters, in order, as pickled chunks to its standard output; the replay unpickles
them (about 2 µs an ECC sample) while the helper parses the next chunk. The stream is the one the
file would give parsed in process, item for item, so results do not change (the tests compare).

Used for files of at least ``parse_ahead_min_bytes`` (8 MiB by default) by
:class:`stream.inputs.files.MergedInputs` (``faultstream replay``, ``replay --to``); smaller files,
and machines with one CPU, parse in process. A helper that fails says why and the replay stops
with that; a replay that stops early (an error, the dead-letter limit) stops its helpers.

The helper is a fresh interpreter (not a fork): the replay process already holds chdb's threads,
and a forked copy of a process with threads can deadlock on a lock some other thread held.

Wire format of the helper's output: frames of an 8-byte big-endian length and a pickle of
``(kind, position, payload)``: ``kind`` ``"items"`` (records and
:class:`~schemas.records.InvalidRecord`), ``"end"`` (the last items) or ``"error"`` (a message);
``position`` is the bytes of the file read so far (compressed bytes for gzip), -1 at the end.
Items travel as segments in their order (:func:`pack_items`): runs of ECC samples as one MessagePack
array each (msgspec writes and reads a sample in well under a microsecond, pickle in several), the
rest pickled.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import msgspec

from schemas.records import EccSample, InvalidRecord, Record
from stream.inputs.parsers import open_input, parse_open_file
from stream.inputs.parsers.options import Format, ParseOptions

__all__ = ["ParseAheadError", "ParsedAhead", "Segments", "pack_items", "parse_ahead_wanted", "unpack_items"]

#: Items a chunk: large enough that a frame's overhead vanishes, small enough that the replay
#: starts within milliseconds and the pipe holds little.
_CHUNK_ITEMS = 2048
_HEADER = struct.Struct(">Q")
#: Frames the helper may have parsed ahead of the replay (about 0.3 MB each): a whole scrape of a
#: 16,384-node fleet.
_QUEUED_FRAMES = 128
#: The setting that turns it off (its hint in error messages).
_SETTING = "FAULTSTREAM_PARSE_AHEAD_MIN_BYTES"


_SAMPLES_OUT = msgspec.msgpack.Encoder()
_SAMPLES_IN = msgspec.msgpack.Decoder(list[EccSample])

#: A frame's items: runs of ECC samples packed as MessagePack (bytes), anything else as a list.
Segments = list[bytes | list[Any]]


def pack_items(items: list[Any]) -> Segments:
    """Items as segments, in order: each run of :class:`EccSample` one MessagePack array."""
    segments: Segments = []
    start = 0
    size = len(items)
    while start < size:
        end = start
        if type(items[start]) is EccSample:
            while end < size and type(items[end]) is EccSample:
                end += 1
            segments.append(_SAMPLES_OUT.encode(items[start:end]))
        else:
            while end < size and type(items[end]) is not EccSample:
                end += 1
            segments.append(items[start:end])
        start = end
    return segments


def unpack_items(segments: Segments) -> Iterator[Any]:
    """The items of :func:`pack_items`' segments, equal to the packed ones."""
    for segment in segments:
        if type(segment) is bytes:
            try:
                yield from _SAMPLES_IN.decode(segment)
            except msgspec.ValidationError:  # a value the wire refuses (a time stamp out of range)
                yield from (_sample(fields) for fields in msgspec.msgpack.decode(segment))
        else:
            yield from segment


def _sample(fields: dict[str, Any]) -> EccSample:
    return EccSample(
        ts_ms=fields["ts"],
        cluster=fields["cluster"],
        node=fields["node"],
        gpu=fields["gpu"],
        pci_bus_id=fields["pci_bus_id"],
        counters=fields["counters"],
        source=fields["source"],
    )


class ParseAheadError(RuntimeError):
    """The helper process failed (its message says why, its standard error has the rest)."""


def parse_ahead_wanted(size: int, min_bytes: int) -> bool:
    """Whether a file of ``size`` bytes gets a helper process on this machine, given the setting
    ``parse_ahead_min_bytes`` (0: never; the helper's start, ~0.3 s on another CPU, is paid back
    after a few megabytes of DCGM scrapes).

    >>> several_cpus = (os.cpu_count() or 1) > 1
    >>> parse_ahead_wanted(100 << 20, 8 << 20) == several_cpus, parse_ahead_wanted(100 << 20, 0)
    (True, False)
    """
    return 0 < min_bytes <= size and (os.cpu_count() or 1) > 1


class ParsedAhead:
    """The items of one input file, parsed by a helper process; iterate once.

    Parameters
    ----------
    path
        The file (plain or gzip).
    fmt, options
        Its format and the options to parse it with.
    source
        The name records and dead letters carry (the path as given).
    chunk_items
        Items the helper sends at a time.
    parts
        ``(helper, helpers, part_bytes)``: parse only parts ``helper``, ``helper + helpers`` … of an
        uncompressed DCGM file cut into parts (:mod:`stream.inputs.dcgm_parts`, which reads the
        frames with :meth:`frames`).
    """

    def __init__(
        self,
        path: Path,
        fmt: Format,
        options: ParseOptions,
        source: str,
        chunk_items: int = _CHUNK_ITEMS,
        parts: tuple[int, int, int] | None = None,
    ) -> None:
        self.source = source
        self._position = 0
        self._finished = False  # the helper sent its last frame: it is exiting
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "stream.inputs.parse_ahead"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        assert self._process.stdin is not None and self._process.stdout is not None
        self._out: IO[bytes] = self._process.stdout
        self._process.stdin.write(pickle.dumps((str(path), fmt.value, options, source, chunk_items, parts)))
        self._process.stdin.close()

    def position(self) -> int:
        """Bytes of the file parsed so far by the helper; -1 once it has read all of it."""
        return self._position

    def __iter__(self) -> Iterator[Record | InvalidRecord]:
        try:
            for _kind, payload in self.frames():
                yield from unpack_items(payload)
        finally:
            self.close()

    def frames(self) -> Iterator[tuple[str, Any]]:
        """``(kind, payload)`` of each frame up to and with the last (``"end"``); the position is kept."""
        while True:
            kind, position, payload = self._next_frame()
            if kind == "error":
                raise ParseAheadError(f"{self.source}: the parser process failed: {payload}")
            self._position = position
            if kind == "end":
                self._finished = True
            yield kind, payload
            if kind == "end":
                return

    def _next_frame(self) -> tuple[str, int, Any]:
        header = self._out.read(_HEADER.size)
        data = b""
        if len(header) == _HEADER.size:
            (length,) = _HEADER.unpack(header)
            data = self._out.read(length)
            if len(data) == length:
                frame: tuple[str, int, Any] = pickle.loads(data)
                return frame
        # The output ended before a whole frame: the helper died (killed, out of memory).
        status = self._process.wait()
        raise ParseAheadError(
            f"{self.source}: the parser process ended without finishing (exit status {status}); "
            f"set {_SETTING}=0 to parse in process"
        )

    def close(self) -> None:
        """Stop the helper if it is still running, and reap it."""
        if self._finished:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=5)
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()
        self._out.close()


class _FrameWriter:
    """Frames written to the replay by a thread, up to ``_QUEUED_FRAMES`` ahead of it.

    A DCGM file gives its samples a scrape at a time (131,072 of them for a 16,384-node fleet):
    written straight to the pipe, the parser would wait for the replay to take them all before it
    reads the next scrape, and the replay would then wait for that scrape; queued, both work at once.
    """

    def __init__(self, out: IO[bytes]) -> None:
        out.flush()
        self._fd = out.fileno()
        self._frames: queue.Queue[bytes | None] = queue.Queue(_QUEUED_FRAMES)
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="parse-ahead-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (data := self._frames.get()) is not None:
            if self._failed is not None:
                continue  # drain: the parser learns it at its next frame
            try:
                _write_all(self._fd, _HEADER.pack(len(data)) + data)
            except BaseException as exc:  # a closed pipe: told to the parser
                self._failed = exc

    def write(self, kind: str, position: int, payload: object) -> None:
        if self._failed is not None:
            raise BrokenPipeError from self._failed
        self._frames.put(pickle.dumps((kind, position, payload), protocol=pickle.HIGHEST_PROTOCOL))

    def close(self) -> None:
        """Write what is queued and stop; raise BrokenPipeError if the replay stopped reading."""
        self._frames.put(None)
        self._thread.join()
        if self._failed is not None:
            raise BrokenPipeError from self._failed


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``, however many calls it takes (a write to a pipe the reader is
    slow to empty may take part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _serve(stdin: IO[bytes], out: IO[bytes]) -> int:
    """The helper: parse the file named on ``stdin``, write its frames to ``out``."""
    from stream.gc_tuning import tune_for_streaming

    path, fmt, options, source, chunk_items, parts = pickle.loads(stdin.read())
    tune_for_streaming()
    writer = _FrameWriter(out)
    try:
        try:
            if parts is not None:
                from stream.inputs.dcgm_parts import serve_parts

                serve_parts(writer.write, Path(path), options, source, chunk_items, *parts)
                writer.close()
                return 0
            handle = open_input(Path(path))
            raw = getattr(handle, "fileobj", None) or handle
            items: list[Record | InvalidRecord] = []
            for item in parse_open_file(handle, Format(fmt), options, source):
                items.append(item)
                if len(items) >= chunk_items:
                    writer.write("items", raw.tell(), pack_items(items))
                    items = []
            writer.write("end", -1, pack_items(items))
        except (BrokenPipeError, KeyboardInterrupt):
            raise
        except Exception as exc:  # reported to the replay, which stops with it
            writer.write("error", 0, f"{type(exc).__name__}: {exc}")
            writer.close()
            return 1
        writer.close()
    except BrokenPipeError:
        return 0  # the replay stopped reading (it stopped early): nothing to say
    except KeyboardInterrupt:
        return 130  # Ctrl-C reached the whole process group: the replay reports it
    return 0


if __name__ == "__main__":
    sys.exit(_serve(sys.stdin.buffer, sys.stdout.buffer))
