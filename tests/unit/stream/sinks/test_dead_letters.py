"""Dead-letter limits and the Kafka dead-letter producer (pure logic: no broker)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from schemas.outputs import DeadLetter
from schemas.records import InvalidRecord
from stream.sinks.dead_letters import DeadLetterLimitExceeded, DeadLetterPolicy, KafkaDeadLetters


def test_many_good_records_do_not_hide_a_run_of_bad_ones() -> None:
    policy = DeadLetterPolicy(max_ratio=0.5, min_records=10, max_consecutive=100)
    for _ in range(100_000):
        policy.good("xid/0")
    for _ in range(99):
        policy.bad("xid/0", "not JSON (…)")
        policy.check("xid/0")  # the ratio alone would take 100,000 bad records to stop
    policy.bad("xid/0", "not JSON (…)")
    with pytest.raises(DeadLetterLimitExceeded, match="the last 100 records in a row"):
        policy.check("xid/0")


def test_a_good_record_resets_the_run_and_other_sources_are_counted_apart() -> None:
    policy = DeadLetterPolicy(max_consecutive=3)
    for _ in range(2):
        policy.bad("a", "x")
        policy.bad("b", "x")
    policy.good("a")
    policy.bad("a", "x")
    policy.check("a")
    policy.bad("b", "x")
    with pytest.raises(DeadLetterLimitExceeded, match=r"^b: "):
        policy.check("b")


def test_letters_the_broker_did_not_take_stay_pending_for_the_next_commit_point() -> None:
    calls = []

    async def send(key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> Any:
        calls.append(key)
        if len(calls) == 2:
            raise ConnectionError("broker down")
        acked = asyncio.get_running_loop().create_future()
        acked.set_result(None)
        return acked

    letters = KafkaDeadLetters(send)
    for n in range(2):
        letters.produce(DeadLetter(f"s{n}", "offset 1", "not JSON", b"{", "xid"), batch=5)
    letters.produce(DeadLetter("other", "offset 1", "not JSON", b"{", "xid"), batch=6)
    with pytest.raises(ConnectionError):
        asyncio.run(letters.deliver(5))
    assert letters.pending(5) == 2  # nothing is forgotten before every ack came
    assert asyncio.run(letters.deliver(5)) == 2 and letters.pending(5) == 0
    assert letters.pending(6) == 1
    letters.discard(6)
    assert letters.pending(6) == 0


def test_a_letter_of_the_largest_input_fits_a_kafka_message() -> None:
    """A 1 MB bad value whose reason quotes it once made a 2 MB letter the producer refused,
    which stopped the worker (found by tests/e2e/test_fuzz_worker.py)."""
    from schemas.records import MAX_REASON_CHARS
    from stream.kafka.codec import decode_record
    from stream.sinks.dead_letters import MAX_TOPIC_RAW_BYTES, to_dead_letter

    value = b'{"ts": "' + b"9" * 1_000_000 + b'", "cluster": "c", "node": "n", "xid": 79}'
    with pytest.raises(InvalidRecord) as caught:
        decode_record("xid", value, "xid/0", "offset 5")
    assert len(caught.value.reason) <= MAX_REASON_CHARS and caught.value.reason.endswith("characters, cut)")
    letter = to_dead_letter(caught.value, "xid")
    assert letter.raw == value  # the table keeps it whole
    sent: list[tuple[bytes, bytes, dict[str, bytes]]] = []

    async def send(key: bytes, raw: bytes, headers: list[tuple[str, bytes]]) -> Any:
        sent.append((key, raw, dict(headers)))
        return asyncio.sleep(0)

    letters = KafkaDeadLetters(send)
    letters.produce(letter)
    asyncio.run(letters.deliver(0))
    [(key, raw, headers)] = sent
    assert raw == value[:MAX_TOPIC_RAW_BYTES] and headers["raw_bytes"] == str(len(value)).encode()
    size = len(key) + len(raw) + sum(len(name) + len(header) for name, header in headers.items())
    assert size < 1024 * 1024 - 16 * 1024, "room for the record overhead under the 1 MiB default"


def test_concurrent_deliveries_send_each_letter_once_and_lose_none() -> None:
    """The publish timer and a commit point may deliver one partition's letters at once."""
    sent: list[bytes] = []
    letters = KafkaDeadLetters.__new__(KafkaDeadLetters)

    async def send(key: bytes, raw: bytes, headers: list[tuple[str, bytes]]) -> Any:
        sent.append(raw)
        if raw == b"2":  # produced while the first delivery waits for its acks
            letters.produce(DeadLetter("xid/0", "offset 9", "not JSON", b"3", "xid"), batch=0)
        return asyncio.sleep(0.01)

    KafkaDeadLetters.__init__(letters, send)

    async def scenario() -> None:
        for raw in (b"1", b"2"):
            letters.produce(DeadLetter("xid/0", f"offset {raw.decode()}", "not JSON", raw, "xid"), batch=0)
        await asyncio.gather(letters.deliver(0), letters.deliver(0))
        await letters.deliver(0)

    asyncio.run(scenario())
    assert sorted(sent) == [b"1", b"2", b"3"] and letters.pending(0) == 0
