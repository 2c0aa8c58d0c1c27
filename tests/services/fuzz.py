"""Hostile input for the worker: messages no collector should send, interleaved with a good stream.

:func:`hostile_messages` makes them (seeded, so a failure can be replayed): random bytes,
truncated JSON, wrong types, huge and negative numbers, deeply nested JSON, invalid UTF-8, 1 MB
values, impossible XID codes, times in 1970 and 2200, null and empty values, JSON that is not an
object. Every one is bad: none holds a line the schema accepts, so each of its non-blank lines
must become one dead letter (blank lines carry no record, by the wire contract). The kernel-log
topic gets raw values as a shipper's: driver lines that cannot be read (malformed Xid lines, no
time stamp, broken JSON envelopes, a 1 MB line), one dead letter each, and other drivers' lines
and garbage, which must make none. An XID code
inside the catalog's range but unknown to it is not among them: the SPEC keeps and flags those.

:func:`run_fuzz` sends them to a real broker while ``faultstream replay --to`` publishes the
bundled example's jobs and scrapes and its kernel log goes line by line to the kernel-log topic,
among the hostile values; it runs one real worker over all of it, and reports what came out; the
e2e test asserts on the report, ``tests/soak/fuzz.py`` prints it for 10,000 messages.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaProducer

from schemas.records import XidEvent
from stream.inputs.parsers.kernel_log import parse_kernel_log
from stream.inputs.parsers.options import ParseOptions
from stream.kafka.codec import message_lines
from tests.services import kafka
from tests.services.worker import ROOT, Worker, assert_same_results, cli, query, results, wait_until_caught_up

EXAMPLE_LOGS = ROOT / "examples" / "sim-48x14" / "logs"
TS = 1_704_067_200_000  # 2024-01-01, inside the example's weeks

_GOOD: dict[str, dict[str, object]] = {
    "xid": {"ts": TS, "cluster": "sim", "node": "node0001", "xid": 79, "pci_bus_id": "0000:07:00"},
    "ecc": {"ts": TS, "cluster": "sim", "node": "node0001", "gpu": 0, "counters": {"sbe_volatile": 1}},
    "job": {"ts": TS, "cluster": "sim", "job_id": "1", "state": "FAILED", "nodes": ["node0001"], "gpus": 8},
}
#: A value of each field that the field refuses, by type.
_WRONG_TYPES: dict[str, list[object]] = {
    "ts": [[TS], {"ms": TS}, 1.5, True, None, "yesterday"],
    "cluster": [5, [], {}, None, " "],
    "node": [7, ["node0001"], None, "", False],
    "xid": ["79", 79.0, [79], None, True],
    "gpu": ["0", 0.5, [0], True],
    "counters": [[1, 2], "sbe", 3, {"sbe_volatile": "1"}, {"no_such_counter": 1}, {"sbe_volatile": -1}],
    "job_id": [True, [], None, ""],
    "state": ["EXPLODED", 7, None, ""],
    "nodes": ["node0001", [1, 2], None, [""]],
    "gpus": ["8", 8.5, -8],
    "pci_bus_id": [7, "nonsense", "zz:zz:zz"],
}
#: Numbers past what a field holds: huge, negative, beyond 64 bits (orjson then makes floats).
_NUMBERS: dict[str, list[int]] = {
    "xid": [0, -1, -(2**63), 65536, 10**6, 2**63, 2**64 - 1, 10**30],
    "gpu": [-1, 65536, 2**40, 10**30],
    "gpus": [-1, 2**32, 10**25],
    "ts": [-(10**15), 0, 86_400_000, 7_258_118_400_000, 10**30, -1],
    "counters": [-3, 2**64, 10**40],
}
_TIMES = ["1970-01-01T00:00:00Z", "1970-06-01T12:00:00.5+00:00", "2200-01-01T00:00:00Z", "2200-12-31T23:59:59Z",
          "1969-12-31T23:59:59Z", "9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z"]  # fmt: skip


def _wrong_type(rng: random.Random, kind: str) -> bytes:
    record = dict(_GOOD[kind])
    optional = ("gpu", "pci_bus_id") if kind != "job" else ()  # a job has neither: it would ignore them
    field_name = rng.choice([name for name in _WRONG_TYPES if name in record or name in optional])
    record[field_name] = rng.choice(_WRONG_TYPES[field_name])
    if field_name == "gpu" and kind == "ecc":
        record.pop("pci_bus_id", None)
    return json.dumps(record).encode()


def _number(rng: random.Random, kind: str) -> bytes:
    record = dict(_GOOD[kind])
    names = {"xid": ["xid", "gpu", "ts"], "ecc": ["gpu", "ts", "counters"], "job": ["gpus", "ts"]}[kind]
    name = rng.choice(names)
    value = rng.choice(_NUMBERS[name])
    if name == "counters":
        record["counters"] = {"dbe_volatile": value}
    else:
        record[name] = value
    return json.dumps(record).encode()


def _time(rng: random.Random, kind: str) -> bytes:
    record = dict(_GOOD[kind])
    name = "ts" if kind != "job" else rng.choice(["ts", "start", "end"])
    record[name] = rng.choice(_TIMES) if rng.random() < 0.7 else rng.choice([0, 7_258_118_400_000])
    return json.dumps(record).encode()


def _truncated(rng: random.Random, kind: str) -> bytes:
    text = json.dumps(_GOOD[kind]).encode()
    return text[: rng.randrange(1, len(text) - 1)]


def _nested(rng: random.Random, kind: str) -> bytes:
    depth = rng.choice([200, 600, 1100, 5000, 50_000])
    if rng.random() < 0.5:
        return b"[" * depth + b"]" * depth
    record = json.dumps(_GOOD[kind]).encode()[:-1]
    return record + b', "ts": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}"


def _invalid_utf8(rng: random.Random, kind: str) -> bytes:
    text = json.dumps(_GOOD[kind]).encode()
    cut = text.index(b"node") + 8 if b"node" in text else 10
    return (
        text[:cut]
        + rng.choice([b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"])
        + text[cut:]
    )


def _one_megabyte(rng: random.Random, kind: str) -> bytes:
    size = 1_000_000
    choice = rng.randrange(4)
    if choice == 0:
        return b"A" * size  # not JSON
    if choice == 1:
        return json.dumps({**_GOOD[kind], "ts": "9" * size}).encode()  # the reason quotes the value
    if choice == 2:
        return json.dumps({**_GOOD[kind], "xid": "x" * size, "counters": "c" * size}).encode()[: size + 200]
    return b"\n".join([b"{" * 1000] * (size // 1001))  # a thousand bad lines in one message


def _random_bytes(rng: random.Random, kind: str) -> bytes:
    return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))


def _not_an_object(rng: random.Random, kind: str) -> bytes:
    return rng.choice([b"[]", b"null", b"123", b'"xid"', b"true", b"[{}]", b"{}", b'{"kind": "xid"}'])


def _several_bad_lines(rng: random.Random, kind: str) -> bytes:
    makers = [_wrong_type, _number, _time, _truncated, _not_an_object]
    return b"\n".join(rng.choice(makers)(rng, kind) for _ in range(rng.randrange(2, 6)))


#: Kinds of hostility and their shares of the messages.
MAKERS: dict[str, tuple[float, Callable[[random.Random, str], bytes]]] = {
    "random bytes": (0.15, _random_bytes),
    "truncated JSON": (0.12, _truncated),
    "wrong types": (0.15, _wrong_type),
    "huge and negative numbers": (0.15, _number),
    "times in 1970 and 2200": (0.12, _time),
    "deeply nested JSON": (0.05, _nested),
    "invalid UTF-8": (0.08, _invalid_utf8),
    "1 MB values": (0.01, _one_megabyte),
    "not an object": (0.07, _not_an_object),
    "several bad lines": (0.10, _several_bad_lines),
}


_KERNEL_TIME = b"2024-01-01T00:00:00.000001+00:00 node0001 kernel: "


def _kernel_bad_xid(rng: random.Random) -> bytes:
    payload = rng.choice([b"banana", b"", b"-5, x", b"99999999999999999999, x", b"\xff\xfe, x", b"((("])
    bad_id = rng.choice([b"", b"PCI:zz:zz", b"PCI:0000:07:00"])
    return _KERNEL_TIME + b"NVRM: Xid (" + bad_id + b"): " + payload


def _kernel_no_time(rng: random.Random) -> bytes:
    return (
        rng.choice([b"", b"node0001 kernel: ", b"[  12.5] "])
        + b"NVRM: Xid (PCI:0000:07:00): 79, pid=1, name=x, y"
    )


def _kernel_bad_host(rng: random.Random) -> bytes:
    return b"2024-01-01T00:00:00Z node\xff\xfe01 kernel: NVRM: Xid (PCI:0000:07:00): 79, pid=1, name=x, y"


def _kernel_bad_envelope(rng: random.Random) -> bytes:
    xid = "NVRM: Xid (PCI:0000:07:00): 79, pid=1, name=x, y"
    good = {"__REALTIME_TIMESTAMP": "1704067200000001", "_HOSTNAME": "node0001", "MESSAGE": xid}
    broken = rng.choice(["host", "time", "message", "types", "truncated"])
    if broken == "truncated":
        text = json.dumps(good).encode()
        return text[: rng.randrange(text.index(b"NVRM") + 4, len(text) - 1)]
    document: dict[str, object] = dict(good)
    if broken == "host":
        document.pop("_HOSTNAME")
    elif broken == "time":
        document["__REALTIME_TIMESTAMP"] = rng.choice(["soon", None, [1], "1.5e3"])
        if document["__REALTIME_TIMESTAMP"] is None:
            document.pop("__REALTIME_TIMESTAMP")
    elif broken == "message":
        document["MESSAGE"] = rng.choice([7, {"m": xid}, True])
        document["note"] = "NVRM"
    else:
        document["_HOSTNAME"] = rng.choice([["node 1"], "two words", 5])
    return json.dumps(document).encode()


def _kernel_huge(rng: random.Random) -> bytes:
    return _KERNEL_TIME + b"NVRM: Xid (PCI:0000:07:00): " + b"9" * 1_000_000


def _kernel_wrong_json_types(rng: random.Random) -> bytes:
    """A shipper's envelope (journald, Vector, Fluent Bit) with a field of the wrong JSON type."""
    xid = "NVRM: Xid (PCI:0000:07:00): 79, pid=1, name=x, y"
    document = rng.choice([
        {"message": xid, "host": "node0001", "timestamp": rng.choice([True, {"s": 1}, [1.5]])},  # Vector
        {"MESSAGE": xid, "_HOSTNAME": "node0001", "@timestamp": rng.choice([False, {"t": 1.5}, [1.5, 2]])},
        {"MESSAGE": [5, "NVRM"], "_HOSTNAME": "node0001", "__REALTIME_TIMESTAMP": "1704067200000001"},
        {"MESSAGE": [78, 86, 82, 77, 300], "_HOSTNAME": "node0001", "__REALTIME_TIMESTAMP": "1704067200000001"},
        {"MESSAGE": xid, "_HOSTNAME": rng.choice([None, 1.5, {"h": 1}]), "__REALTIME_TIMESTAMP": "1704067200000001"},
        {"MESSAGE": xid, "_HOSTNAME": "node0001", "__REALTIME_TIMESTAMP": rng.choice([{"us": 1}, [], "1e999"])},
    ])  # fmt: skip
    return json.dumps(document, separators=(",", ":")).encode()  # compact, as journalctl prints it


def _kernel_invalid_utf8(rng: random.Random) -> bytes:
    """Invalid UTF-8 where the parser needs text: the time stamp, the XID code, the PCI id."""
    return rng.choice([
        b"2024-01-01T00:00:\xff0.000001+00:00 node0001 kernel: NVRM: Xid (PCI:0000:07:00): 79, pid=1, name=x, y",
        _KERNEL_TIME + b"NVRM: Xid (PCI:0000:07:00): 7\xff9, pid=1, name=x, y",
        _KERNEL_TIME + b"NVRM: Xid (PCI:00\xc3\x2800:07:00): 79, pid=1, name=x, y",
    ])  # fmt: skip


def _kernel_huge_envelope(rng: random.Random) -> bytes:
    """A 1 MB journald entry whose message is a driver line cut short."""
    message = "NVRM: Xid (" + "x" * 1_000_000
    document = {"__REALTIME_TIMESTAMP": "1704067200000001", "_HOSTNAME": "node0001", "MESSAGE": message}
    return json.dumps(document).encode()


def _kernel_nothing(rng: random.Random) -> bytes | None:
    """No value at all, an empty one, or a 1 MB line of another driver's."""
    return rng.choice([None, b"", _KERNEL_TIME + b"eth0: " + b"z" * 1_000_000])


def _kernel_not_ours(rng: random.Random) -> bytes:
    return rng.choice([
        bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))).replace(b"NVRM", b"nvrm").replace(b"SXid", b"sxid"),
        _KERNEL_TIME + b"eth0: link up",
        b"",
        b"{" * 100,
        b'{"MESSAGE": [65, 66, 67], "_HOSTNAME": "node0001"}',
    ])  # fmt: skip


#: Hostile kernel-log values (raw, as a shipper's): each a driver line that cannot be read (one dead
#: letter), or another driver's (nothing).
KERNEL_MAKERS: dict[str, tuple[float, Callable[[random.Random], bytes | None], int]] = {
    "kernel: malformed Xid line": (0.22, _kernel_bad_xid, 1),
    "kernel: no time stamp": (0.12, _kernel_no_time, 1),
    "kernel: invalid UTF-8 host": (0.04, _kernel_bad_host, 1),
    "kernel: invalid UTF-8 in time or header": (0.06, _kernel_invalid_utf8, 1),
    "kernel: broken JSON envelope": (0.2, _kernel_bad_envelope, 1),
    "kernel: wrong JSON types": (0.14, _kernel_wrong_json_types, 1),
    "kernel: 1 MB driver line": (0.01, _kernel_huge, 1),
    "kernel: 1 MB JSON envelope": (0.02, _kernel_huge_envelope, 1),
    "kernel: not ours": (0.15, _kernel_not_ours, 0),
    "kernel: null, empty or 1 MB other line": (0.04, _kernel_nothing, 0),
}


@dataclass(frozen=True)
class Hostile:
    topic_kind: str  # xid, ecc, job or kernel (the topic it goes to)
    what: str
    value: bytes | None
    key: bytes | None

    @property
    def bad_lines(self) -> int:
        """Dead letters it must make: one per non-blank line (a null value counts as one empty line);
        a kernel-log value is one record, bad (a driver line) or not ours."""
        if self.topic_kind == "kernel":
            return KERNEL_MAKERS[self.what][2]
        return sum(1 for _ in message_lines(self.value or b"", 0))


def hostile_messages(count: int, seed: int) -> list[Hostile]:
    """``count`` hostile messages, the same for the same seed."""
    rng = random.Random(seed)
    names = list(MAKERS)
    weights = [MAKERS[name][0] for name in names]
    out = []
    kernel_names = list(KERNEL_MAKERS)
    kernel_weights = [KERNEL_MAKERS[name][0] for name in kernel_names]
    for _ in range(count):
        kind = rng.choice(["xid", "ecc", "job", "kernel"])
        if kind == "kernel":
            what = rng.choices(kernel_names, kernel_weights)[0]
            value = KERNEL_MAKERS[what][1](rng)
            key = rng.choice([None, b"node0001", b"\xff"])
            out.append(Hostile(kind, what, value, key if value is not None else b"\xff"))  # Kafka needs one
            continue
        roll = rng.random()
        if roll < 0.01:
            out.append(Hostile(kind, "null value", None, b"node0001"))
            continue
        if roll < 0.02:
            out.append(Hostile(kind, "empty value", b"", None))
            continue
        what = rng.choices(names, weights)[0]
        value = MAKERS[what][1](rng, kind)
        key = rng.choice([b"node0001", b"", None, b"\xff\xfe", rng.randbytes(16)])
        out.append(Hostile(kind, what, value, key))
    return out


@dataclass
class FuzzReport:
    """What one fuzz run sent and what came out of the worker."""

    sent: int = 0
    bad_lines: int = 0
    sent_by_kind: Counter[str] = field(default_factory=Counter)
    dead_letters: int = 0
    dead_letters_on_topic: int = 0
    distinct_on_topic: int = 0
    dead_letters_by_reason: Counter[str] = field(default_factory=Counter)
    letters_without_reason: int = 0
    worker_crashes: int = 0
    results_equal: bool = False
    results_problem: str = ""
    #: The example's kernel-log lines shipped among the hostile values, the XID events they hold
    #: (read from the file), and the XID events the worker stored.
    kernel_lines: int = 0
    kernel_events: int = 0
    xid_events: int = 0
    seconds: float = 0.0
    log: Path | None = None


async def _send(
    bootstrap: str,
    topics: dict[str, str],
    messages: list[Hostile],
    pause_every: int,
    kernel_lines: list[bytes],
) -> None:
    """The hostile messages, with the good kernel-log lines spread among them (no key, as omkafka)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=8 * 1024 * 1024, linger_ms=5)
    await producer.start()
    try:
        pending = []
        per_message = -(-len(kernel_lines) // max(len(messages), 1))
        good = iter(kernel_lines)
        for number, message in enumerate(messages, 1):
            pending.append(
                await producer.send(topics[message.topic_kind], value=message.value, key=message.key)
            )
            for line in itertools.islice(good, per_message):
                pending.append(await producer.send(topics["kernel"], value=line))
            if number % pause_every == 0:  # spread over the replay's publication: interleaved
                await asyncio.gather(*pending)
                pending.clear()
                await asyncio.sleep(0.05)
        for line in good:
            pending.append(await producer.send(topics["kernel"], value=line))
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


def run_fuzz(
    bootstrap: str,
    workdir: Path,
    count: int,
    *,
    seed: int = 15,
    embedded: tuple[dict[str, list[dict]], str] | None = None,
) -> FuzzReport:
    """Send ``count`` hostile messages interleaved with the example's replay to a fresh deployment
    (one partition a topic), run one worker to the end, and compare its tables with the embedded
    replay's (``embedded``: its results and the hour compared up to; made here when not given)."""
    started = time.monotonic()
    report = FuzzReport()
    env = kafka.deployment_env(
        bootstrap, f"f{uuid.uuid4().hex[:8]}", 1,
        FAULTSTREAM_DATA_DIR=str(workdir / "worker-data"),
        # Hostile input is the point here: the limits that stop a bad deploy are lifted.
        FAULTSTREAM_DEAD_LETTER_MAX_RATIO="1.0", FAULTSTREAM_DEAD_LETTER_MAX_CONSECUTIVE="0",
    )  # fmt: skip
    cli(env, "init-kafka")
    try:
        messages = hostile_messages(count, seed)
        report.sent = len(messages)
        report.bad_lines = sum(message.bad_lines for message in messages)
        report.sent_by_kind = Counter(message.what for message in messages)
        topics = {"xid": env["FAULTSTREAM_TOPIC_XID"], "ecc": env["FAULTSTREAM_TOPIC_ECC"],
                  "job": env["FAULTSTREAM_TOPIC_JOBS"], "kernel": env["FAULTSTREAM_TOPIC_KERNEL_LOG"]}  # fmt: skip
        # The example's jobs and scrapes through replay --to; its kernel log line by line through
        # the kernel-log topic, among the hostile values (good records around bad ones). Two
        # publishers side by side do not keep the topics in event-time order between them (what
        # publishers must do: docs/kafka.md), so the worker starts once both are done and reads
        # it all as a backlog: a live worker took some kernel lines for late when replay --to ran
        # ahead of them on a loaded machine.
        kernel_log = EXAMPLE_LOGS / "kernel.log"
        kernel_lines = [line for line in kernel_log.read_bytes().splitlines() if line.strip()]
        report.kernel_lines = len(kernel_lines)
        report.kernel_events = len({
            item.event_id
            for item in parse_kernel_log(kernel_lines, ParseOptions(), str(kernel_log))
            if isinstance(item, XidEvent)
        })  # fmt: skip
        publisher = subprocess.Popen(
            [sys.executable, "-m", "stream.cli", "replay", *(str(p) for p in sorted(EXAMPLE_LOGS.iterdir()) if p != kernel_log),
             "--to", f"kafka://{bootstrap}", "--no-progress"],
            env={**os.environ, **env}, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        asyncio.run(_send(bootstrap, topics, messages, max(count // 200, 1), kernel_lines))
        _, stderr = publisher.communicate(timeout=600)
        assert publisher.returncode == 0, f"replay --to failed: {stderr.decode()[-2000:]}"
        worker = Worker(env, workdir / "worker-store", workdir / "worker.log")
        report.log = worker.log_path
        try:
            wait_until_caught_up(env, [worker], timeout=900)
        finally:
            report.worker_crashes = worker.restarts + (worker.process.poll() is not None)
            worker.stop()
        letters = query(
            worker.store,
            "SELECT reason, count() AS n FROM faultstream.dead_letters FINAL GROUP BY reason",
        )
        from stream.sinks.dead_letters import reason_class

        for row in letters:
            report.dead_letters += row["n"]
            report.dead_letters_by_reason[reason_class(row["reason"])] += row["n"]
            report.letters_without_reason += row["n"] if not row["reason"].strip() else 0
        report.dead_letters_on_topic, report.distinct_on_topic = _topic_letters(env)
        stored = query(worker.store, "SELECT count() AS n FROM faultstream.xid_events FINAL")
        report.xid_events = int(stored[0]["n"])
        expected, before = embedded if embedded is not None else _embedded(workdir)
        try:
            assert_same_results(results([worker.store], before), expected)
            report.results_equal = True
        except AssertionError as exc:
            report.results_problem = str(exc)[:3000]
    finally:
        kafka.delete_deployment_topics(env)
    report.seconds = time.monotonic() - started
    return report


def _topic_letters(env: dict[str, str]) -> tuple[int, int]:
    """(messages, distinct (source, location)) on the dead-letter topic."""
    from tests.services.kafka import consume

    bootstrap, topic = env["FAULTSTREAM_KAFKA_BOOTSTRAP"], env["FAULTSTREAM_TOPIC_DEAD_LETTERS"]
    _, ends = asyncio.run(consume(bootstrap, topic, 1, 0, 15))
    messages, _ = asyncio.run(consume(bootstrap, topic, 1, sum(ends.values()), 300))
    assert len(messages) == sum(ends.values()), "the dead-letter topic was not read to its end"
    places = {(message.key, dict(message.headers)["location"]) for message in messages}
    return len(messages), len(places)


def _embedded(workdir: Path) -> tuple[dict[str, list[dict]], str]:
    store = workdir / "embedded-store"
    cli({}, "replay", str(EXAMPLE_LOGS), "--clickhouse", f"chdb://{store}", "--no-progress")
    [last] = query(store, "SELECT toString(toStartOfHour(max(ts))) AS t FROM faultstream.xid_events")
    return results([store], last["t"]), last["t"]
