"""2,000 hostile messages interleaved with the bundled example, through a real broker and worker.

The worker must not stop (its dead-letter limits are lifted for this run), every bad line must be
a dead letter with a reason — in the table and on the dead-letter topic — and the good data's
results must equal the embedded replay's. tests/soak/fuzz.py runs the same with 10,000 messages
and prints the figures; tests/services/fuzz.py says what the messages are.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.services.fuzz import KERNEL_MAKERS, hostile_messages, run_fuzz

pytestmark = [pytest.mark.e2e, pytest.mark.load_tolerant]


def test_the_hostile_set_covers_every_kind_and_no_message_is_valid() -> None:
    from schemas.records import InvalidRecord
    from stream.kafka.codec import decode_message
    from stream.worker.rekeyed import kernel_copies

    messages = hostile_messages(2000, seed=15)
    kinds = {message.what for message in messages}
    assert {"random bytes", "truncated JSON", "wrong types", "huge and negative numbers", "deeply nested JSON",
            "invalid UTF-8", "1 MB values", "times in 1970 and 2200", "null value"} <= kinds  # fmt: skip
    assert {message.what for message in messages if message.topic_kind == "kernel"} == set(KERNEL_MAKERS)
    for message in messages:
        if message.topic_kind == "kernel":
            copies, items = kernel_copies("c")(message.value or b"", 1704067200000, "fuzz/0", "offset 0")
            assert copies == [], message.what
        else:
            items = list(decode_message(message.topic_kind, message.value or b"", "fuzz/0", 0))
        assert all(isinstance(item, InvalidRecord) and item.reason for item in items), message.what
        assert len(items) == message.bad_lines
    assert hostile_messages(50, seed=15) == messages[:50], "the same seed gives the same messages"


def test_hostile_messages_crash_nothing_and_all_land_in_dead_letters(
    bootstrap: str, tmp_path: Path, embedded: tuple[dict[str, list[dict]], str]
) -> None:
    report = run_fuzz(bootstrap, tmp_path, 2000, seed=15, embedded=embedded)
    assert report.worker_crashes == 0, report.log.read_text()[-3000:] if report.log else ""
    assert report.dead_letters == report.bad_lines, dict(report.dead_letters_by_reason)
    # The topic is at least once, like every Kafka output: each bad line is on it, maybe twice.
    assert report.distinct_on_topic == report.bad_lines <= report.dead_letters_on_topic
    assert report.letters_without_reason == 0
    assert report.results_equal, report.results_problem
    # The example's kernel log, shipped line by line among the hostile values: every XID kept.
    assert report.kernel_events > 900 and report.xid_events == report.kernel_events
    reasons = set(report.dead_letters_by_reason)
    assert {"field 'ts' out of range", "field 'xid' must be <= 65535", "not JSON"} <= reasons, reasons
