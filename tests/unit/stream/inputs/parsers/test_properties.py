"""Property-based tests of every input parser (hypothesis): whatever the bytes, nothing raises.

For any input, each parser yields only records that satisfy their schema and dead letters with a
reason and a location inside the input; every other line was skipped as irrelevant. Good lines
among arbitrary ones are still read, with their own line numbers: one bad line never spoils its
neighbours. HYPOTHESIS_EXAMPLES=3000 runs more examples (150 by default).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.records import EccSample, InvalidRecord, JobEvent, XidEvent
from stream.inputs.parsers import Format, ParseOptions, detect_format, parse_file
from stream.inputs.parsers.dcgm import parse_dcgm
from stream.inputs.parsers.hostlist import expand_hostlist
from stream.inputs.parsers.jsonl import parse_jsonl
from stream.inputs.parsers.kernel_log import parse_kernel_log
from stream.inputs.parsers.kernel_times import month_number
from stream.inputs.parsers.nvidia_smi import parse_nvidia_smi
from stream.inputs.parsers.sacct import parse_sacct

Parser = Callable[[Iterable[bytes], ParseOptions, str], Iterator[object]]
PARSERS: dict[str, Parser] = {
    "kernel": parse_kernel_log,
    "sacct": parse_sacct,
    "dcgm": parse_dcgm,
    "nvidia-smi": parse_nvidia_smi,
    "jsonl": parse_jsonl,
}
OPTION_SETS = [
    ParseOptions(),
    ParseOptions(year=2024, boot_time_ms=1_700_000_000_000, scrape_time_ms=1_700_000_000_000, node="n"),
    ParseOptions(year=2024, timezone="Europe/Warsaw", cluster="c2"),
]
RUNS = settings(
    max_examples=int(os.environ.get("HYPOTHESIS_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# Pieces of every format, so that arbitrary lines come close to the shapes the parsers look for.
FRAGMENTS = [
    "NVRM: Xid (PCI:0000:3b:00): ", "NVRM: Xid (", "SXid (PCI:0000:05:00.0): ", "nvidia-nvswitch0: ", "79", "12028",
    ", pid=12, name=python, ", "GPU has fallen off the bus.", "NVRM: GPU 0000:3b:00.0: ", "[", "]", "[ 12.5] ",
    "[Mon Jan 15 10:23:45 2024] ", "Jan 15 10:23:45 node1 kernel: ", "paź 15 10:23:45 n kernel: ", "<4>", "<4>1 ",
    "2024-01-15T10:23:45,123+00:00 ", "kern  :warn  : ", "[Jan15 10:23] ", "[  +0.5] ", "```", "> ", "**", "`",
    "Tue 2024-01-15 10:23:45 CET n kernel: ", "1705314225.5 n kernel: ", "    ", "\t", "\r", "\x00", "\ufffd",
    "JobID|State|Start|End|NodeList", "JobIDRaw|State", "|", "|#", "FAILED", "CANCELLED by 9", "2024-01-15T10:00:00",
    "n[001-003,7]", "gres/gpu=8", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_XID_ERRORS", '{gpu="0",',
    'pci_bus_id="00000000:3B:00.0",Hostname="n1"} ', "9223372036854775794", "1.40737488355328e+14", " 1705314225000",
    "NaN", "-1", "GPU 00000000:07:00.0", "    Volatile", "        DRAM Uncorrectable      : ", "N/A", "[N/A]",
    "Timestamp                 : Mon Jan 15 10:23:45 2024", "ECC Errors", '{"ts": 0, "cluster": "c", "node": "n", ',
    '"xid": 79}', '"counters": {"sbe_volatile": 1}', "é", "月", "Mär",
]  # fmt: skip
line_text = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=12)), max_size=10).map("".join)
any_line = st.one_of(
    line_text.map(lambda text: text.encode("utf-8", "surrogatepass")), st.binary(max_size=120)
)
any_lines = st.lists(any_line, max_size=40)


def check_output(items: Iterable[object], line_count: int) -> list[object]:
    """Every item is a valid record or a dead letter with a reason and a location in the input."""
    out = list(items)
    for item in out:
        if isinstance(item, InvalidRecord):
            assert item.reason.strip()
            numbers = [int(n) for n in re.findall(r"\d+", item.location.split("(")[0])]
            assert numbers and all(1 <= n <= line_count + 1 for n in numbers), item.location
            assert isinstance(item.raw, bytes)
            continue
        assert isinstance(item, XidEvent | EccSample | JobEvent), type(item)
        assert type(item).from_dict(item.to_wire(), item.source) == item  # it satisfies its schema
        line = int(item.source.rsplit(":", 1)[1])
        assert 1 <= line <= line_count
    return out


@RUNS
@given(lines=any_lines, options=st.sampled_from(OPTION_SETS), name=st.sampled_from(sorted(PARSERS)))
def test_any_lines_give_records_dead_letters_or_nothing(
    lines: list[bytes], options: ParseOptions, name: str
) -> None:
    check_output(PARSERS[name](lines, options, "/data/node7.log"), len(lines))


@RUNS
@given(data=st.binary(max_size=2000), name=st.sampled_from(sorted(PARSERS)))
def test_arbitrary_bytes_split_anywhere_never_raise(data: bytes, name: str) -> None:
    lines = data.splitlines(keepends=True)
    check_output(PARSERS[name](lines, OPTION_SETS[1], "x"), len(lines))


GOOD_KERNEL = [
    (b"Jan 15 10:23:45 gpu7 kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=python, DBE", 48, "gpu"),
    (b"[Mon Jan 15 10:23:45 2024] nvidia-nvswitch2: SXid (PCI:0000:c5:00.0): 20034, Fatal, Link 44", 20034,
     "nvswitch"),
    (b"kern  :warn  : 2024-01-15T10:23:45,283302+00:00 NVRM: Xid (PCI:0000:3b:00): 13, x", 13, "gpu"),
]  # fmt: skip


@RUNS
@given(junk=st.lists(any_lines, min_size=len(GOOD_KERNEL) + 1, max_size=len(GOOD_KERNEL) + 1))
def test_good_kernel_lines_among_junk_are_read_with_their_line_numbers(junk: list[list[bytes]]) -> None:
    lines: list[bytes] = []
    wanted: dict[int, tuple[int, str]] = {}
    for chunk, (good, code, device) in zip(junk, [*GOOD_KERNEL, (b"", 0, "")], strict=True):
        lines.extend(chunk)
        if good:
            lines.append(good)
            wanted[len(lines)] = (code, device)
    out = check_output(parse_kernel_log(lines, ParseOptions(year=2024), "n.log"), len(lines))
    got = {int(e.source.rsplit(":", 1)[1]): (e.xid, e.device) for e in out if isinstance(e, XidEvent)}
    for line_no, expected in wanted.items():
        assert got.get(line_no) == expected, (line_no, lines[line_no - 1])


@RUNS
@given(rows=st.lists(any_line, max_size=20))
def test_sacct_rows_after_a_header_are_events_or_dead_letters(rows: list[bytes]) -> None:
    lines = [b"JobID|State|Start|End|NodeList", *rows]
    out = check_output(parse_sacct(lines, ParseOptions(), "s"), len(lines))
    assert all(isinstance(item, JobEvent | InvalidRecord) for item in out)


@RUNS
@given(data=st.binary(max_size=3000))
def test_any_file_is_detected_or_refused_with_a_reason_and_parsed_without_raising(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "input"
        path.write_bytes(data)
        try:
            fmt = detect_format(path)
        except ValueError as exc:
            assert "binary" in str(exc)
            return
        assert isinstance(fmt, Format)
        check_output(parse_file(path, OPTION_SETS[0]), max(len(data.splitlines()), 1))


@RUNS
@given(text=st.text(max_size=60))
def test_hostlists_expand_or_refuse_with_value_error(text: str) -> None:
    try:
        nodes = expand_hostlist(text)
    except ValueError:
        return
    assert all(isinstance(node, str) for node in nodes)


@RUNS
@given(token=st.text(max_size=10))
def test_month_names_are_a_month_or_none(token: str) -> None:
    number = month_number(token)
    assert number is None or 1 <= number <= 12
