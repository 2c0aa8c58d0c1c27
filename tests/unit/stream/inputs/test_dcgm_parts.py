"""A DCGM file parsed in parts by several helper processes (stream.inputs.dcgm_parts): the items of
the file parsed whole, item for item, whatever the parts' size."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from schemas.records import InvalidRecord, XidEvent
from stream.inputs.dcgm_parts import ParsedInParts, part_bounds
from stream.inputs.parsers.dcgm_blocks import parse_dcgm_file
from stream.inputs.parsers.options import ParseOptions

OPTIONS = ParseOptions(cluster="c")
METRICS = ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")


def _scrape(ts: int, xid_of: dict[tuple[int, int], int], metrics: tuple[str, ...] = METRICS) -> str:
    lines = []
    for metric in metrics:
        lines += [f"# HELP {metric} help", f"# TYPE {metric} counter"]
        for node in range(3):
            for gpu in range(4):
                value = xid_of.get((node, gpu), 0) if "XID" in metric else node + gpu
                labels = f'{{gpu="{gpu}",pci_bus_id="00000000:{gpu + 7:02X}:00.0",Hostname="node{node}"}}'
                lines.append(f"{metric}{labels} {value} {ts}")
    return "\n".join(lines) + "\n"


def _history(scrapes: int = 12) -> str:
    """XID codes that come, stay for scrapes (no new event) and go, across any cut into parts."""
    text = ""
    for index in range(scrapes):
        xids = {
            (1, 2): 79 if 2 <= index < 7 else 0,
            (2, 0): 48 if index % 3 == 0 else 0,
            (0, 3): 31 + index // 4,
        }
        text += _scrape(1_705_312_800_000 + index * 900_000, xids)
    return text


def _whole(path: Path) -> list[str]:
    with path.open("rb") as handle:
        return [_key(item) for item in parse_dcgm_file(handle, OPTIONS, str(path))]


def _key(item: object) -> str:
    if isinstance(item, InvalidRecord):
        return f"dead {item.reason} {item.raw!r} {item.location}"
    return repr(item)


def _in_parts(path: Path, helpers: int, part_bytes: int) -> tuple[list[str], ParsedInParts]:
    parsed = ParsedInParts(path, OPTIONS, str(path), helpers, part_bytes)
    return [_key(item) for item in parsed], parsed


def test_parts_begin_at_scrape_starts() -> None:
    text = _history(4).encode()
    bounds = part_bounds(text, 100)
    starts = [
        index + 1 for index in range(len(text)) if text.startswith(b"\n# HELP " + METRICS[0].encode(), index)
    ]
    scrape_starts = {text.index(METRICS[0].encode() + b"{", start) for start in [0, *starts]}
    assert bounds[0] == 0 and bounds[-1] == len(text)
    assert set(bounds[1:-1]) == scrape_starts - {text.index(METRICS[0].encode() + b"{")}
    assert part_bounds(b"# nothing we read\n", 4) == [0, 18]


@pytest.mark.parametrize(("helpers", "part_bytes"), [(2, 1), (2, 3000), (3, 7000), (2, 1 << 30)])
def test_parts_give_the_items_of_the_whole_file(tmp_path: Path, helpers: int, part_bytes: int) -> None:
    path = tmp_path / "dcgm.prom"
    path.write_text(_history())
    expected = _whole(path)
    assert sum("XidEvent" in item for item in expected) >= 6  # events came in several parts
    items, parsed = _in_parts(path, helpers, part_bytes)
    assert items == expected and parsed.rereads == 0


def test_untimed_lines_dead_letters_and_no_trailing_newline(tmp_path: Path) -> None:
    text = _history(6)
    lines = text.splitlines()
    lines[40] = lines[40].rsplit(" ", 1)[0]  # no time stamp: one dead letter for the file, at its end
    lines[200] = lines[200].rsplit(" ", 1)[0]
    lines[150] = lines[150].replace('gpu="1"', 'gpu="x"')
    path = tmp_path / "dcgm.prom"
    path.write_text("\n".join(lines))
    expected = _whole(path)
    assert expected[-1].startswith("dead 2 samples have no time stamp")
    items, parsed = _in_parts(path, 2, 2000)
    assert items == expected and parsed.rereads == 0


def test_a_file_out_of_the_exporter_layout_is_read_again_in_process(tmp_path: Path) -> None:
    # scrapes that list the families in turning orders: a part may begin where no scrape begins
    text = "".join(
        _scrape(1_705_312_800_000 + index * 900_000, {}, METRICS[index % 3 :] + METRICS[: index % 3])
        for index in range(9)
    )
    path = tmp_path / "dcgm.prom"
    path.write_text(text)
    expected = _whole(path)
    items, parsed = _in_parts(path, 2, 1500)
    assert items == expected and parsed.rereads == 1


def test_the_first_xid_of_a_part_is_an_event_only_when_it_changed(tmp_path: Path) -> None:
    text = "".join(_scrape(1_705_312_800_000 + index * 900_000, {(0, 0): 79}) for index in range(4))
    path = tmp_path / "dcgm.prom"
    path.write_text(text)
    items, _ = _in_parts(path, 2, 1)
    assert sum("XidEvent" in item for item in items) == 1 and items == _whole(path)
    with path.open("rb") as handle:
        assert (
            sum(
                isinstance(item, XidEvent)
                for item in parse_dcgm_file(io.BufferedReader(handle), OPTIONS, "x")
            )
            == 1
        )
