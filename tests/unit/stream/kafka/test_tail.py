"""The SRE console's pure parts: filters, repeats, line format, --since."""

from __future__ import annotations

import asyncio
import io
from types import SimpleNamespace

import orjson
import pytest
from aiokafka import TopicPartition

from stream.kafka.tail import (
    COMPACT_WIDTH,
    IncidentFilter,
    TailError,
    TailOptions,
    _line,
    _News,
    _print_messages,
    format_line,
    parse_since,
    short_summary,
    updates,
)


def incident(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {
        "incident_id": "i1",
        "kind": "xid_fatal",
        "severity": "critical",
        "status": "open",
        "node": "node0007",
        "gpu": 3,
        "first_evidence": "2024-01-03T10:00:00.000Z",
        "summary": "XID 79: GPU has fallen off the bus",
        "action": "drain the node",
        "version": 2,
    }
    base.update(fields)
    return base


def test_update_count_follows_the_version_rule() -> None:
    assert updates(incident(version=2)) == 0  # opened with one piece of evidence
    assert updates(incident(version=6)) == 2  # two more pieces of evidence
    assert updates(incident(version=7)) == 3  # ... and resolved


def test_filters_combine_lists_with_and_and_patterns_with_or() -> None:
    only = IncidentFilter.parse("critical,warn", "xid_*,lemon*", "node000?")
    assert only(incident())
    assert not only(incident(severity="info"))
    assert not only(incident(kind="ecc_trend"))
    assert not only(incident(node="node0010"))
    assert IncidentFilter.parse(None, None, None)(incident(severity="info"))


def test_an_unknown_severity_is_refused_with_the_choices() -> None:
    with pytest.raises(TailError, match="unknown severity fatal; use critical, warn, info"):
        IncidentFilter.parse("fatal", None, None)


def test_repeats_and_older_versions_are_not_news() -> None:
    news = _News()
    assert news(incident(version=2))
    assert not news(incident(version=2))  # at-least-once repeat
    assert news(incident(version=4))
    assert not news(incident(version=3))
    assert news(incident(incident_id="i2", version=2))


def test_a_line_says_when_what_where_and_what_to_do() -> None:
    line = format_line(incident(version=4), colour=False)
    assert line.startswith("2024-01-03 10:00:00 CRITICAL xid_fatal")
    assert "node0007/3 " in line and line.endswith("XID 79: GPU has fallen off the bus")
    wide = format_line(incident(version=4), colour=False, wide=True)
    assert "node0007/3 " in wide and "1 update " in wide and wide.endswith("-> drain the node")
    assert format_line(incident(gpu=None, action=""), colour=False, wide=True).endswith("bus")


def test_the_action_is_printed_once() -> None:
    summary = (
        "[critical] Uncorrectable ECC error on node0039 GPU 0000:87:00, 1 evidence since "
        "2024-01-11T18:00:00.000Z; resolved. Action: RESET_GPU: drain the node, reset the GPU"
    )
    message = incident(
        gpu="0000:87:00", node="node0039", summary=summary, action="RESET_GPU: drain the node, reset the GPU"
    )
    wide = format_line(message, colour=False, wide=True)
    assert wide.count("RESET_GPU") == 1 and wide.endswith(" -> RESET_GPU: drain the node, reset the GPU")
    compact = format_line(message, colour=False)
    assert "RESET_GPU" not in compact and compact.endswith("  Uncorrectable ECC error")


def test_the_default_line_fits_120_columns() -> None:
    long = incident(
        kind="lemon_node",
        gpu=None,
        summary="[warn] Lemon node: signals far above the fleet over 28 d (xid_days 7 where 0.83 is usual, "
        "hw_incidents 2 where 0.12 is usual) on node0007, 7 evidence since 2024-01-08T00:00:00.000Z; "
        "updated. Action: drain the node and run full diagnostics",
    )
    line = format_line(long, colour=False)
    assert len(line) == COMPACT_WIDTH and line.endswith("…")
    assert short_summary(long).endswith("hw_incidents 2 where 0.12 is usual)")  # node, count, status: columns
    assert len(format_line(incident(), colour=True)) <= COMPACT_WIDTH + 12  # colour codes are not columns


class Records:
    """What ``_print_messages`` uses of a consumer: ``getmany`` and ``position``."""

    def __init__(self, partitions: dict[TopicPartition, list[bytes]]) -> None:
        self.pending = {tp: list(values) for tp, values in partitions.items()}
        self.read = dict.fromkeys(partitions, 0)

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[object]]:
        batch = {}
        for tp, values in self.pending.items():  # one partition at a time, as a broker may deliver
            if values:
                batch[tp] = [SimpleNamespace(value=v) for v in values]
                self.read[tp] += len(values)
                self.pending[tp] = []
                break
        return batch

    async def position(self, tp: TopicPartition) -> int:
        return self.read[tp]


def test_no_follow_prints_in_time_order_not_partition_by_partition() -> None:
    p0, p1 = TopicPartition("t", 0), TopicPartition("t", 1)
    messages = {
        p0: [
            orjson.dumps(incident(incident_id="a", node="n0", first_evidence=f"2024-01-0{d}T00:00:00Z"))
            for d in (1, 5)
        ],
        p1: [
            orjson.dumps(incident(incident_id="b", node="n1", first_evidence=f"2024-01-0{d}T00:00:00Z"))
            for d in (2, 3)
        ],
    }
    messages[p0][1] = orjson.dumps(
        incident(incident_id="c", node="n0", first_evidence="2024-01-05T00:00:00Z")
    )
    messages[p1][1] = orjson.dumps(
        incident(incident_id="d", node="n1", first_evidence="2024-01-03T00:00:00Z")
    )
    out = io.StringIO()
    options = TailOptions("127.0.0.1:1", "t", follow=False)
    printed = asyncio.run(_print_messages(Records(messages), options, {p0: 2, p1: 2}, out))  # type: ignore[arg-type]
    assert printed == 4
    assert [line[:10] for line in out.getvalue().splitlines()] == [
        "2024-01-01", "2024-01-02", "2024-01-03", "2024-01-05",
    ]  # fmt: skip


def test_colour_by_severity_and_green_when_resolved() -> None:
    assert format_line(incident(), colour=True).startswith("\033[1;31m")
    assert format_line(incident(severity="warn"), colour=True).startswith("\033[33m")
    assert format_line(incident(status="resolved"), colour=True).startswith("\033[32m")
    assert format_line(incident(), colour=True).endswith("\033[0m")


def test_json_mode_passes_the_message_through_and_drops_repeats() -> None:
    options = TailOptions("127.0.0.1:1", "t", as_json=True)
    raw = orjson.dumps(incident())
    news = _News()
    assert _line(raw, options, news) == raw.decode()
    assert _line(raw, options, news) is None
    assert _line(b"{broken", options, news) is None  # nothing that is not JSON reaches a pipe
    assert _line(b"{broken", TailOptions("127.0.0.1:1", "t"), _News()) == "(not an incident: b'{broken')"
    bad_version = orjson.dumps(incident(version="two"))
    assert _line(bad_version, TailOptions("127.0.0.1:1", "t"), _News()).startswith("(malformed incident: ")


def test_since_takes_durations_and_times() -> None:
    assert parse_since("15m", now_ms=3_600_000) == 2_700_000
    assert parse_since("1d", now_ms=86_400_000) == 0
    assert parse_since("2024-01-03T10:00:00Z") == 1_704_276_000_000
    with pytest.raises(TailError, match="--since takes a duration"):
        parse_since("yesterday")


def test_colour_auto_needs_a_terminal_and_no_NO_COLOR() -> None:
    from stream.kafka.tail import want_colour

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert want_colour("auto", Terminal(), environ=[])
    assert not want_colour("auto", Terminal(), environ=["NO_COLOR"])
    assert not want_colour("auto", io.StringIO(), environ=[])
    assert want_colour("always", io.StringIO(), environ=["NO_COLOR"])


def test_an_incident_addressed_to_a_user_shows_the_user_not_a_node() -> None:
    crash_loop = incident(
        kind="job_app_errors", severity="warn", gpu="", evidence={"owner": "dbg", "nodes": ["node0007", "node0009"]},
        summary="[warn] Application errors follow user dbg's jobs: most of their runs fail with application XIDs "
        "on 2 node(s), 9 evidence since 2024-01-03T10:00:00.000Z; open. Action: tell user dbg",
    )  # fmt: skip
    line = format_line(crash_loop, colour=False)
    assert "user/dbg" in line and "node0007" not in line
    assert "node0007" in format_line(incident(), colour=False)
