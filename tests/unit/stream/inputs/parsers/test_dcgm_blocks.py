"""The block reading of DCGM scrapes (stream.inputs.parsers.dcgm_blocks) gives the reference's items
(parse_dcgm, line by line), item for item, however the text is cut into blocks."""

from __future__ import annotations

import gzip
import io
import random

import pytest

from schemas.records import EccSample, InvalidRecord, XidEvent
from stream.inputs.parsers.dcgm import DcgmState, PendingXid, parse_dcgm
from stream.inputs.parsers.dcgm_blocks import DcgmBlockParser, parse_dcgm_file
from stream.inputs.parsers.options import ParseOptions

OPTIONS = ParseOptions(cluster="c")
SOURCE = "dcgm.prom"
METRICS = (
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_RETIRED_PENDING",
)


def _key(item: object) -> tuple[object, ...]:
    if isinstance(item, InvalidRecord):
        return ("dead", item.reason, item.raw, item.source, item.location)
    if isinstance(item, EccSample):
        return ("ecc", item, tuple(item.counters.items()))  # the counters' order too
    assert isinstance(item, XidEvent)
    return ("xid", item)


def _reference(text: bytes, options: ParseOptions = OPTIONS) -> list[tuple[object, ...]]:
    return [_key(item) for item in parse_dcgm(io.BytesIO(text), options, SOURCE)]


def _blocks(text: bytes, cuts: list[int], options: ParseOptions = OPTIONS) -> list[tuple[object, ...]]:
    """Feed ``text`` cut after the lines that end at or after each of ``cuts`` (whole lines per block)."""
    parser = DcgmBlockParser(options, SOURCE)
    out: list[object] = []
    start = 0
    for cut in [*sorted(cuts), len(text)]:
        end = text.find(b"\n", max(cut, start) - 1) + 1 if cut < len(text) else len(text)
        if end <= start:
            continue
        block = text[start:end]
        parser.feed(block if block.endswith(b"\n") else block + b"\n", out)  # type: ignore[arg-type]
        start = end
    parser.finish(out)  # type: ignore[arg-type]
    return [_key(item) for item in out]


def _file(text: bytes, options: ParseOptions = OPTIONS) -> list[tuple[object, ...]]:
    return [_key(item) for item in parse_dcgm_file(io.BytesIO(text), options, SOURCE)]


def _labels(node: str, gpu: int, extra: str = "") -> str:
    return f'{{gpu="{gpu}",UUID="GPU-{node}-{gpu}",pci_bus_id="00000000:{gpu + 7:02X}:00.0",Hostname="{node}"{extra}}}'


def _scrape(
    ts: int, nodes: int = 3, gpus: int = 4, value: int = 0, metrics: tuple[str, ...] = METRICS
) -> str:
    lines = []
    for metric in metrics:
        lines += [f"# HELP {metric} help text", f"# TYPE {metric} counter"]
        lines += [
            f"{metric}{_labels(f'node{n:02d}', g)} {value + n + g} {ts}"
            for n in range(nodes)
            for g in range(gpus)
        ]
    return "\n".join(lines) + "\n"


def _same_everywhere(text: bytes, options: ParseOptions = OPTIONS) -> list[tuple[object, ...]]:
    """The reference's items, checked equal to the file reading and to blocks cut at every line."""
    expected = _reference(text, options)
    assert _file(text, options) == expected
    assert _blocks(text, [], options) == expected
    line_ends = [index + 1 for index, byte in enumerate(text) if byte == ord("\n")]
    assert _blocks(text, line_ends, options) == expected  # one line a block
    rng = random.Random(len(text))
    for _ in range(5):
        cuts = rng.sample(range(len(text)), min(len(text), 6))
        assert _blocks(text, cuts, options) == expected
    return expected


def test_plain_scrapes_are_read_in_bulk_and_equal_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    text = (_scrape(1_705_312_800_000) + _scrape(1_705_313_700_000, value=2)).encode()
    items = _same_everywhere(text)
    by_line: list[int] = []
    monkeypatch.setattr(DcgmState, "line", lambda self, physical, line_no, out: by_line.append(line_no))
    monkeypatch.setattr(DcgmState, "apply", lambda *args: by_line.append(0))
    assert _file(text) == items and not by_line  # nothing went line by line
    assert sum(1 for item in items if item[0] == "ecc") == 2 * 12
    samples = [item[1] for item in items if item[0] == "ecc"]
    assert [sample.source for sample in samples[:2]] == [f"{SOURCE}:3", f"{SOURCE}:4"]  # type: ignore[attr-defined]


def test_gpus_listed_in_another_order_by_one_metric() -> None:
    first = _scrape(1_705_312_800_000, metrics=METRICS[:1])
    lines = _scrape(1_705_312_800_000, metrics=METRICS[1:2]).splitlines(keepends=True)
    shuffled = lines[:2] + list(reversed(lines[2:]))
    _same_everywhere((first + "".join(shuffled)).encode())


def test_gpus_not_in_node_order_are_sorted_as_the_reference_sorts_them() -> None:
    lines = _scrape(1_705_312_800_000).splitlines(keepends=True)
    per_metric = 2 + 12
    text = "".join(
        "".join(lines[start : start + 2] + list(reversed(lines[start + 2 : start + per_metric])))
        for start in range(0, len(lines), per_metric)
    )
    assert _same_everywhere(text.encode())


def test_comments_help_type_and_series_we_do_not_read() -> None:
    text = (
        "# a comment\n"
        + "DCGM_FI_DEV_GPU_TEMP"
        + _labels("node00", 0)
        + " 41 1705312800000\n"
        + _scrape(1_705_312_800_000, nodes=2, gpus=2)
        + "DCGM_FI_DEV_SM_CLOCK"
        + _labels("node00", 0)
        + " 1410 1705312800000\n"
        + "  DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
        + _labels("node00", 0)
        + " 5 1705312800000\n"  # indented: not read
        + "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL_X"
        + _labels("node00", 0)
        + " 5 1705312800000\n"  # another metric
        + _scrape(1_705_313_700_000, nodes=2, gpus=2)
    )
    _same_everywhere(text.encode())


def test_label_order_and_escaped_quotes_in_labels() -> None:
    reordered = '{Hostname="node00",pci_bus_id="00000000:07:00.0",gpu="0"}'
    escaped = '{gpu="1",modelName="A \\"quoted\\" name, with {braces}",Hostname="node00"}'
    text = (
        f"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{reordered} 1 1705312800000\n"
        f"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{escaped} 2 1705312800000\n"
        f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{reordered} 3 1705312800000\n"
        f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{escaped} 4 1705312800000\n"
    )
    items = _same_everywhere(text.encode())
    assert [item[0] for item in items] == ["ecc", "ecc"]


def test_nan_garbage_negative_blank_and_stale_values() -> None:
    base = _scrape(1_705_312_800_000, nodes=2, gpus=2).splitlines(keepends=True)
    broken = list(base)
    row = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" + _labels("node01", 1)
    broken[3] = row.replace("node01", "node00").replace('gpu="1"', 'gpu="0"') + " NaN 1705312800000\n"
    broken[4] = row.replace('gpu="1"', 'gpu="0"').replace("node01", "node00") + " -3 1705312800000\n"
    broken[5] = row + " 9223372036854775794 1705312800000\n"  # DCGM_INT64_NOT_SUPPORTED: left out
    broken[17] = row.replace("ECC_SBE", "ECC_DBE") + " 2147483634 1705312800000\n"  # an INT32 blank
    broken[20] = broken[20].rstrip("\n").rsplit(" ", 2)[0] + " +Inf 1705312800000\n"
    stale = "DCGM_FI_DEV_RETIRED_PENDING" + _labels("node00", 0) + " Stale 1705312800000\n"  # a stale marker
    text = (
        "".join(broken)
        + stale
        + "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
        + _labels("node00", 0)
        + " 3.0 1705313700000\n"
    )
    items = _same_everywhere(text.encode())
    assert sum(1 for item in items if item[0] == "dead") == 4


def test_crlf_lines() -> None:
    text = (_scrape(1_705_312_800_000) + _scrape(1_705_313_700_000, value=1)).replace("\n", "\r\n")
    items = _same_everywhere(text.encode())
    assert sum(1 for item in items if item[0] == "ecc") == 24


def test_no_trailing_newline_and_lines_without_time_stamps() -> None:
    text = _scrape(1_705_312_800_000).rstrip("\n")
    assert _same_everywhere(text.encode())
    untimed = "".join(
        line.rsplit(" ", 1)[0] + "\n" for line in _scrape(1).splitlines() if not line.startswith("#")
    )
    items = _same_everywhere(untimed.encode())
    assert [item[0] for item in items] == ["dead"]  # one dead letter for the file, at its end
    assert _same_everywhere(untimed.encode(), ParseOptions(cluster="c", scrape_time_ms=1_705_312_800_000))


def test_xid_changes_across_scrapes_and_a_line_cut_at_a_block_boundary() -> None:
    scrapes = [_scrape(1_705_312_800_000 + index * 900_000, value=0) for index in range(4)]
    scrapes[1] = scrapes[1].replace(
        "DCGM_FI_DEV_XID_ERRORS" + _labels("node01", 2) + " 3 ",
        "DCGM_FI_DEV_XID_ERRORS" + _labels("node01", 2) + " 79 ",
    )
    text = "".join(scrapes).encode()
    items = _same_everywhere(text)
    assert [item[1].xid for item in items if item[0] == "xid"]  # type: ignore[union-attr]
    # a block ending inside a line is not a whole line: the file reader carries the rest over
    handle = io.BytesIO(text)
    middle = text.index(b"DCGM_FI_DEV_XID_ERRORS") + 10
    assert _file(text[:middle] + text[middle:]) == items
    assert len(list(parse_dcgm_file(handle, OPTIONS, SOURCE))) == len(items)


def test_duplicate_series_and_runs_of_different_times() -> None:
    scrape = _scrape(1_705_312_800_000, nodes=2, gpus=2)
    lines = scrape.splitlines(keepends=True)
    duplicated = lines[:3] + lines[2:]  # node00/gpu0 twice in the first metric
    other_time = [
        line.replace("1705312800000", "1705312860000") if index % 3 == 0 else line
        for index, line in enumerate(lines)
    ]
    _same_everywhere("".join(duplicated).encode())
    _same_everywhere("".join(other_time).encode())


def test_metric_families_in_another_order_and_missing_gpus() -> None:
    first = _scrape(1_705_312_800_000)
    second = _scrape(1_705_313_700_000, metrics=tuple(reversed(METRICS)))
    fewer = _scrape(1_705_314_600_000, nodes=2) + _scrape(1_705_315_500_000, metrics=METRICS[:2])
    _same_everywhere((first + second + fewer).encode())


def test_labels_that_are_not_plain_are_dead_letters_in_their_place() -> None:
    text = (
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
        + _labels("node00", 0)
        + " 1 1705312800000\n"
        + 'DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{gpu="x",Hostname="node00"} 1 1705312800000\n'
        + 'DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{gpu="1",Hostname="node00" 1 1705312800000\n'
        + "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL 1 1705312800000\n"
        + 'DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{gpu="2",Hostname="node00"} 1 1705312800000 7\n'
        + 'DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{gpu="3",Hostname="nod\xe9"} 1 1705312800000\n'
        + 'DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{gpu="4",Hostname="node00"}\t2\t1705312800000\n'
    )
    items = _same_everywhere(text.encode("latin-1"))
    assert sum(1 for item in items if item[0] == "dead") == 5


@pytest.mark.parametrize("seed", range(30))
def test_random_edits_of_a_scrape(seed: int) -> None:
    """Lines dropped, doubled, swapped or damaged byte-wise: the same items as the reference."""
    rng = random.Random(seed)
    lines = (
        (_scrape(1_705_312_800_000) + _scrape(1_705_313_700_000, value=1)).encode().splitlines(keepends=True)
    )
    for _ in range(rng.randint(1, 6)):
        index = rng.randrange(len(lines))
        edit = rng.choice(("drop", "double", "swap", "byte"))
        if edit == "drop":
            del lines[index]
        elif edit == "double":
            lines.insert(index, lines[index])
        elif edit == "swap" and index + 1 < len(lines):
            lines[index], lines[index + 1] = lines[index + 1], lines[index]
        elif lines[index]:
            position = rng.randrange(len(lines[index]))
            lines[index] = (
                lines[index][:position]
                + bytes([rng.choice(b' {}"\r\n\t09x,=')])
                + lines[index][position + 1 :]
            )
    _same_everywhere(b"".join(lines))


def test_gzip_file_and_a_damaged_one() -> None:
    text = (_scrape(1_705_312_800_000) + _scrape(1_705_313_700_000, value=1)).encode()
    packed = gzip.compress(text)
    reference_lines = list(gzip.GzipFile(fileobj=io.BytesIO(packed)))
    assert _key_list(
        parse_dcgm_file(gzip.GzipFile(fileobj=io.BytesIO(packed)), OPTIONS, SOURCE)
    ) == _reference(b"".join(reference_lines))
    damaged = list(
        parse_dcgm_file(gzip.GzipFile(fileobj=io.BytesIO(packed[: len(packed) // 2])), OPTIONS, SOURCE)
    )
    assert isinstance(damaged[-1], InvalidRecord) and "ends early" in damaged[-1].reason


def _key_list(items: object) -> list[tuple[object, ...]]:
    return [_key(item) for item in items]  # type: ignore[attr-defined]


def test_a_part_of_a_file_leaves_the_first_xid_of_each_gpu_to_the_whole_file() -> None:
    text = _scrape(1_705_312_800_000).replace(
        "DCGM_FI_DEV_XID_ERRORS" + _labels("node01", 2) + " 3 ",
        "DCGM_FI_DEV_XID_ERRORS" + _labels("node01", 2) + " 79 ",
    )
    parser = DcgmBlockParser(OPTIONS, SOURCE, part=True)
    out: list[object] = []
    parser.feed(text.encode(), out)  # type: ignore[arg-type]
    parser.flush(out)  # type: ignore[arg-type]
    pending = [item for item in out if isinstance(item, PendingXid)]
    # every GPU's first code > 0 waits for the value before the part (xid = node + gpu: 11 GPUs > 0)
    assert len(pending) == 11 and not any(isinstance(item, XidEvent) for item in out)
    assert parser.first_name == METRICS[0].encode() and len(parser.xid_seen) == 12
