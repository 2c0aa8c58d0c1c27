"""The kernel-log corpus: every documented shape of dmesg, journalctl and syslog, many languages.

tests/data/kernel/corpus/ is written by its generate.py from the tools' documented formats and
glibc's month names; truth.jsonl says, for each driver line that carries a time stamp, what it is.
Target (SPEC section 6, issue 13): at least 99% of them read with the right code, PCI id and host.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from schemas.records import InvalidRecord, XidEvent
from schemas.timeutil import parse_ts
from stream.inputs.parsers import Format, ParseOptions, parse_file, parse_lines

CORPUS = Path(__file__).resolve().parents[4] / "data" / "kernel" / "corpus"
TRUTH = [json.loads(line) for line in (CORPUS / "truth.jsonl").read_text(encoding="utf-8").splitlines()]
#: What the files do not say: the year of year-less stamps and the boot time of uptime stamps.
OPTIONS = ParseOptions(year=2025, boot_time_ms=parse_ts("2025-01-21T00:00:00Z"), cluster="corpus")
UNPLACEABLE = ["gpu-n01.dmesg-t.log", "gpu-n02.dmesg-x-t.log", "journal-cat.log"]


def read(name: str) -> tuple[dict[int, XidEvent], list[InvalidRecord]]:
    events: dict[int, XidEvent] = {}
    dead: list[InvalidRecord] = []
    for item in parse_file(CORPUS / name, OPTIONS):
        if isinstance(item, InvalidRecord):
            dead.append(item)
        else:
            assert isinstance(item, XidEvent)
            line = int(item.source.rsplit(":", 1)[1])
            assert line not in events, f"{name}:{line} read twice"
            events[line] = item
    return events, dead


def test_at_least_99_percent_of_timestamped_xid_and_sxid_lines_are_read_right() -> None:
    right = 0
    wrong: list[str] = []
    files = sorted({row["file"] for row in TRUTH})
    parsed = {name: read(name) for name in files}
    for row in TRUTH:
        events, _dead = parsed[row["file"]]
        event = events.get(row["line"])
        got = None if event is None else (event.xid, event.device, event.pci_bus_id, event.node)
        want = (row["code"], row["device"], row["pci_bus_id"], row["node"])
        time_ok = event is not None and (
            row["ts_ms"] is None or abs(event.ts_ms - row["ts_ms"]) <= row["tolerance_ms"]
        )
        if got == want and time_ok:
            right += 1
        else:
            wrong.append(f"{row['file']}:{row['line']}: want {want} got {got}")
    share = right / len(TRUTH)
    print(f"kernel corpus: {right}/{len(TRUTH)} = {share:.2%} timestamped driver lines read right")
    assert len(TRUTH) > 500
    assert share >= 0.99, "\n".join(wrong[:20])
    assert wrong == []  # today: all of them


def test_every_timestamped_file_reads_without_dead_letters_and_nothing_extra() -> None:
    expected = Counter(row["file"] for row in TRUTH)
    for name, count in expected.items():
        events, dead = read(name)
        assert dead == [], (name, [d.reason for d in dead])
        assert len(events) == count, name  # SXid detail lines folded, fallen-off GPUs once


@pytest.mark.parametrize("name", UNPLACEABLE)
def test_a_file_without_time_stamps_is_one_clear_reason(name: str) -> None:
    events, dead = read(name)
    assert events == {}
    assert len(dead) == 1
    assert "no time stamp" in dead[0].reason and "cannot be placed" in dead[0].reason
    assert dead[0].location.startswith("lines 1-")


def test_localized_month_files_cover_the_common_lc_time_languages() -> None:
    languages = {name.split(".")[-2] for name in (p.name for p in CORPUS.glob("*.??_??.log"))}
    assert {"de_DE", "fr_FR", "es_ES", "pl_PL", "it_IT", "nl_NL", "pt_BR", "ru_RU"} <= languages


def test_sxid_lines_are_nvswitch_events_with_their_details_in_the_message() -> None:
    events, _ = read("gpu-m01.dmesg-T.multiline.log")
    switches = [e for e in events.values() if e.device == "nvswitch"]
    assert switches and all(e.gpu is None for e in switches)
    assert all("Severity" in e.message and "Data {" in e.message for e in switches)
    gpus = [e for e in events.values() if e.device == "gpu" and e.message.startswith("GPU ") is False]
    assert all("continued: state" in e.message for e in gpus)  # the indented line joined


def test_fallen_off_the_bus_without_a_number_is_xid_79() -> None:
    events, _ = read("gpu-m01.dmesg-T.multiline.log")
    gone = [e for e in events.values() if "fallen off the bus" in e.message and "Xid" not in e.message]
    assert gone and {e.xid for e in gone} == {79}


WRAPPERS = [
    lambda line: b"```" + line,
    lambda line: b"```log " + line + b"```",
    lambda line: b"> " + line,
    lambda line: b"> > `" + line + b"`",
    lambda line: b"**" + line + b"**",
    lambda line: b"  " + line + b"  \r\n",
]


def test_every_corpus_line_reads_the_same_when_pasted_in_any_wrapper() -> None:
    """A line copied into an issue or chat, alone, wrapped the ways markdown wraps it."""
    checked = 0
    for row in TRUTH:
        if row["file"] in ("gpu-a22.dmesg-e.log", "pasted-issue-gpu-p01.md"):
            continue  # reltime deltas need the lines before them; the pasted lines are wrapped already
        line = (CORPUS / row["file"]).read_bytes().split(b"\n")[row["line"] - 1]
        for wrap in WRAPPERS:
            items = parse_lines([wrap(line)], Format.KERNEL, OPTIONS, row["file"])
            events = [e for e in items if isinstance(e, XidEvent)]
            assert [(e.xid, e.device, e.pci_bus_id, e.node) for e in events] == [
                (row["code"], row["device"], row["pci_bus_id"], row["node"])
            ], (row, wrap(line))
            checked += 1
    assert checked > 3000
