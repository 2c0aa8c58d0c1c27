"""``faultstream receive`` on the real broker: every bad body gets its reason (and a dead letter),
nothing crashes, good values around a bad series are kept, and a receiver killed between a
sample's requests takes up what it had gathered.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import cramjam
import orjson
import pytest

from tests.services import kafka
from tests.services.fuzz_receive import body
from tests.services.worker import ROOT, cli, free_port

pytestmark = pytest.mark.e2e

DATA = ROOT / "tests" / "data" / "remote_write"


def gpu(name: str, node: str = "n1", index: int = 0, **more: str) -> dict[str, str]:
    return {"__name__": name, "gpu": str(index), "Hostname": node, **more}


class Receive:
    """A ``faultstream receive`` process of the deployment ``env``."""

    def __init__(self, env: dict[str, str], log: Path, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/api/v1/write"
        self.log_path = log
        started = self.log().count("receiving Prometheus remote_write") if log.exists() else 0
        self.process = subprocess.Popen(
            [sys.executable, "-m", "stream.cli", "receive", "--listen", f"127.0.0.1:{port}"],
            env={**os.environ, **env}, cwd=ROOT, stdout=log.open("a"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while self.log().count("receiving Prometheus remote_write") <= started:
            assert self.process.poll() is None and time.monotonic() < deadline, self.log()
            time.sleep(0.2)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def post(self, data: bytes) -> tuple[int, str]:
        request = urllib.request.Request(
            self.url,
            data=data,
            method="POST",
            headers={"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()


def topic_values(env: dict[str, str], name: str) -> list[tuple[bytes | None, bytes | None, dict[str, bytes]]]:
    bootstrap, topic = env["FAULTSTREAM_KAFKA_BOOTSTRAP"], env[f"FAULTSTREAM_TOPIC_{name}"]
    _, ends = asyncio.run(kafka.consume(bootstrap, topic, 1, 0, 15))
    messages, _ = asyncio.run(kafka.consume(bootstrap, topic, 1, sum(ends.values()), 60))
    return [(m.key, m.value, dict(m.headers)) for m in messages]


@pytest.fixture
def deployment(bootstrap: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    env = kafka.deployment_env(
        bootstrap, f"recv{uuid.uuid4().hex[:6]}", 1, FAULTSTREAM_DATA_DIR=str(tmp_path / "d"),
        FAULTSTREAM_RECEIVE_SETTLE_SECONDS="2", FAULTSTREAM_RECEIVE_MAX_BODY_BYTES=str(4 * 1024 * 1024),
    )  # fmt: skip
    cli(env, "init-kafka")
    yield env
    kafka.delete_deployment_topics(env)


def test_bad_bodies_get_their_reason_and_good_values_around_a_bad_series_are_kept(
    deployment: dict[str, str], tmp_path: Path
) -> None:
    receive = Receive(deployment, tmp_path / "receive.log", free_port())
    try:
        real = (DATA / "prometheus-2.42-scrape-1.bin").read_bytes()
        assert receive.post(b"\x00\x01garbage" * 100)[0] == 400
        status, reason = receive.post(real[: len(real) // 2])
        assert (status, "not a snappy block" in reason) == (400, True)
        status, reason = receive.post(bytes(cramjam.snappy.compress_raw(b"not protobuf at all")))
        assert (status, "not a remote_write WriteRequest" in reason) == (400, True)
        assert receive.post(b"")[0] == 400
        assert receive.post(b"\x00" * (5 * 1024 * 1024))[0] == 413
        assert receive.post(real)[0] == 204
        mixed = [
            (gpu("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "n2"), 4, 1_704_067_200_000),
            ({"__name__": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Hostname": "n2"}, 0, 1_704_067_200_000),  # no gpu
            (gpu("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "n2"), -3, 1_704_067_200_000),  # not a count
        ]
        assert receive.post(body(mixed))[0] == 204
        many = [
            (gpu("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", f"m{n // 8}", n % 8), n, 1_704_067_260_000)
            for n in range(10_000)
        ]
        assert receive.post(body(many))[0] == 204
        time.sleep(4)  # settled
        assert receive.process.poll() is None
    finally:
        receive.process.terminate()
        receive.process.wait(timeout=30)
    assert "Traceback" not in receive.log()
    letters = topic_values(deployment, "DEAD_LETTERS")
    reasons = sorted(headers["reason"].decode().split(" (")[0] for _, _, headers in letters)
    assert reasons == [
        "no 'gpu' label",
        "not a remote_write WriteRequest",
        "not a snappy block",
        "not a snappy block",
        "not a snappy block",
        "value -3.0 is not a non-negative integer",
    ], reasons
    samples = [orjson.loads(value) for _, value, _ in topic_values(deployment, "ECC")]
    by_node = {(s["node"], s["gpu"]): s["counters"] for s in samples}
    assert by_node[("n2", 0)] == {"sbe_volatile": 4}  # kept beside its request's bad series
    assert sum(1 for node, _ in by_node if node.startswith("m")) == 10_000
    assert by_node[("gpu-node-17", 1)] == {"sbe_volatile": 0, "dbe_volatile": 0}


def test_a_receiver_killed_between_a_sample_s_requests_takes_up_what_it_gathered(
    deployment: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    ts = 1_704_067_200_000
    counters = ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")
    xid = "DCGM_FI_DEV_XID_ERRORS"
    first = Receive(deployment, tmp_path / "receive.log", port)
    try:
        for step in range(3):  # three scrapes: the GPU's counters become known; the XID gauge turns 79
            series = [(gpu(name), step, ts + step * 60_000) for name in counters]
            assert (
                first.post(body([*series, (gpu(xid), 79 if step == 2 else 0, ts + step * 60_000)]))[0] == 204
            )
        time.sleep(3)
        assert first.post(body([(gpu(counters[0]), 7, ts + 3 * 60_000)]))[0] == 204  # half of the fourth
        time.sleep(0.5)
    finally:
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=30)
    second = Receive(deployment, tmp_path / "receive.log", port)
    try:
        rest = [(gpu(counters[1]), 1, ts + 3 * 60_000), (gpu(xid), 48, ts + 3 * 60_000)]
        assert second.post(body(rest))[0] == 204  # its other half
        time.sleep(1)
    finally:
        second.process.terminate()
        second.process.wait(timeout=30)
    assert "took up 1 saved requests" in second.log()
    samples = [orjson.loads(value) for _, value, _ in topic_values(deployment, "ECC")]
    fourth = [s for s in samples if s["ts"] == ts + 3 * 60_000]
    assert [s["counters"] for s in fourth] == [{"sbe_volatile": 7, "dbe_volatile": 1}]
    assert sorted({s["ts"] for s in samples}) == [ts + step * 60_000 for step in range(4)]
    # The gauge's changes, each after the gauge's previous sample: the restarted receiver took up
    # the time of the sample that showed 79 as the previous one of the change to 48.
    changes = [orjson.loads(value) for _, value, _ in topic_values(deployment, "XID")]
    assert [(c["ts"] - ts, c["xid"], c["since"] - ts) for c in changes] == [
        (120_000, 79, 60_000),
        (180_000, 48, 120_000),
    ]
