"""Hostile remote_write bodies for ``faultstream receive``, interleaved with good ones.

:func:`hostile_bodies` makes them (seeded): real Prometheus 2.42 bodies cut short (truncated
snappy), snappy blocks of garbage (protobuf that is not a ``WriteRequest``, or by chance one that
holds nothing), random bytes, empty bodies, bit flips in a real body, and requests of 10,000
series. What each must give is what the receiver's own decoder says of it
(:func:`stream.inputs.parsers.remote_write.decode_write_request`, ``dcgm_points``): a 400 and one
dead letter, or a 204 with a dead letter per unusable series. Good bodies (a few GPUs' ECC counters
of their own nodes) go between them; every one of their samples must reach the ``ecc`` topic.
"""

from __future__ import annotations

import random
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import cramjam
import orjson

from stream.inputs.parsers.remote_write import (
    RemoteWriteError,
    WriteRequest,
    dcgm_points,
    decode_write_request,
)
from tests.services import kafka
from tests.services.worker import ROOT, cli, free_port

DATA = ROOT / "tests" / "data" / "remote_write"
TS = 1_704_067_200_000
#: The node names of the good bodies and of the 10,000-series ones.
_OURS = ("good", "many")


def body(series: list[tuple[dict[str, str], float, int]]) -> bytes:
    request = WriteRequest()
    for labels, value, ts in series:
        added = request.timeseries.add()
        for name, label in sorted(labels.items()):
            added.labels.add(name=name, value=label)
        added.samples.add(value=value, timestamp=ts)
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


def _series(node: str, gpus: int, ts: int, value: float = 1) -> list[tuple[dict[str, str], float, int]]:
    return [
        ({"__name__": name, "gpu": str(gpu), "Hostname": node}, value, ts)
        for gpu in range(gpus)
        for name in ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")
    ]


@dataclass(frozen=True)
class Body:
    what: str
    data: bytes
    status: int  # 204 or 400, as the receiver's decoder says
    letters: int  # dead letters it must make
    samples: int  # ECC samples it must put on the ecc topic


def _expected(what: str, data: bytes) -> Body:
    try:
        request = decode_write_request(data)
    except RemoteWriteError:
        return Body(what, data, 400, 1, 0)
    points, bad, _ = dcgm_points(request, "fuzz")
    # Counted: the samples of the nodes made here (each body's own); a real body's GPUs come again
    # in several bodies, whose repeats the receiver drops as late.
    samples = len({(p.node, p.gpu, p.ts_ms) for p in points if p.counter and p.node.startswith(_OURS)})
    return Body(what, data, 204, len(bad), samples)


def hostile_bodies(count: int, seed: int, real: list[bytes]) -> list[Body]:
    """``count`` bodies, about two thirds hostile; each good one names nodes of its own."""
    rng = random.Random(seed)
    out = []
    for number in range(count):
        roll = rng.random()
        if roll < 0.33:
            node = f"good{seed}-{number}"
            out.append(_expected("good", body(_series(node, rng.randrange(1, 5), TS + number * 1000))))
            continue
        kind = rng.choice(["truncated snappy", "garbage protobuf", "random bytes", "empty", "bit flips",
                           "10,000 series"])  # fmt: skip
        if kind == "truncated snappy":
            source = rng.choice(real)
            data = source[: rng.randrange(1, len(source) - 1)]
        elif kind == "garbage protobuf":
            data = bytes(cramjam.snappy.compress_raw(rng.randbytes(rng.randrange(1, 2000))))
        elif kind == "random bytes":
            data = rng.randbytes(rng.randrange(1, 3000))
        elif kind == "empty":
            data = b""
        elif kind == "bit flips":
            flipped = bytearray(rng.choice(real))
            for _ in range(rng.randrange(1, 8)):
                flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
            data = bytes(flipped)
        else:  # a big request: 10,000 series of 1,250 GPUs, a few of them unusable
            node = f"many{seed}-{number}"
            series = _series(node, 5000, TS + number * 1000)
            for index in rng.sample(range(len(series)), 3):
                labels, _, ts = series[index]
                series[index] = (labels, -1.0, ts)  # not a count: a dead letter, the rest kept
            data = body(series)
        out.append(_expected(kind, data))
    return out


@dataclass
class ReceiveFuzzReport:
    sent: Counter[str] = field(default_factory=Counter)
    wrong_status: list[tuple[str, int, int]] = field(default_factory=list)
    reasons_missing: int = 0
    letters_expected: int = 0
    letters_on_topic: int = 0
    samples_expected: int = 0
    samples_on_topic: int = 0
    receiver_alive: bool = False
    tracebacks: int = 0


def _post(url: str, data: bytes) -> tuple[int, str]:
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _values(env: dict[str, str], name: str) -> list[bytes]:
    """Every value on one of the deployment's topics."""
    import asyncio

    bootstrap, topic = env["FAULTSTREAM_KAFKA_BOOTSTRAP"], env[f"FAULTSTREAM_TOPIC_{name}"]
    _, ends = asyncio.run(kafka.consume(bootstrap, topic, 1, 0, 15))
    messages, _ = asyncio.run(kafka.consume(bootstrap, topic, 1, sum(ends.values()), 120))
    return [message.value for message in messages]


def run_receive_fuzz(bootstrap: str, workdir: Path, count: int, seed: int = 15) -> ReceiveFuzzReport:
    """Post ``count`` bodies to a real receiver of a fresh deployment and count what came out."""
    import os
    import subprocess
    import sys

    report = ReceiveFuzzReport()
    env = kafka.deployment_env(
        bootstrap, f"rf{uuid.uuid4().hex[:8]}", 1, FAULTSTREAM_DATA_DIR=str(workdir / "d"),
        FAULTSTREAM_RECEIVE_SETTLE_SECONDS="2",
    )  # fmt: skip
    cli(env, "init-kafka")
    real = [path.read_bytes() for path in sorted(DATA.glob("*.bin"))]
    bodies = hostile_bodies(count, seed, real)
    port = free_port()
    log = workdir / "receive.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "stream.cli", "receive", "--listen", f"127.0.0.1:{port}"],
        env={**os.environ, **env}, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "receiving Prometheus remote_write" not in log.read_text(errors="replace"):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        url = f"http://127.0.0.1:{port}/api/v1/write"
        for item in bodies:
            report.sent[item.what] += 1
            status, reason = _post(url, item.data)
            if status != item.status:
                report.wrong_status.append((item.what, item.status, status))
            if status == 400 and not reason.strip():
                report.reasons_missing += 1
            report.letters_expected += item.letters
            report.samples_expected += item.samples
        time.sleep(4)  # the last samples settle
        report.receiver_alive = process.poll() is None
    finally:
        process.terminate()
        process.wait(timeout=30)
    report.tracebacks = log.read_text(errors="replace").count("Traceback")
    report.letters_on_topic = len(_values(env, "DEAD_LETTERS"))
    samples = [orjson.loads(value) for value in _values(env, "ECC")]
    report.samples_on_topic = len(
        {(s["node"], s["gpu"], s["ts"]) for s in samples if s["node"].startswith(_OURS)}
    )
    kafka.delete_deployment_topics(env)
    return report
