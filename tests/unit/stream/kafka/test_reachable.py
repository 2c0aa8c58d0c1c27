"""Waiting for a broker that does not answer yet; failing at once when waiting cannot help."""

from __future__ import annotations

import asyncio
import logging

import pytest

from stream.kafka.reachable import LONGEST_PAUSE_SECONDS, wait_for_kafka
from stream.kafka.security import KafkaAccessError, KafkaSecurity
from stream.settings import Settings

SECURITY = KafkaSecurity.from_settings(Settings())


class Broker:
    """Answers after ``down`` failed tries with ``error``; keeps a clock the pauses move."""

    def __init__(self, down: int, error: KafkaAccessError) -> None:
        self.down, self.error, self.tries, self.now = down, error, 0, 0.0
        self.pauses: list[float] = []

    async def check(self, settings: Settings) -> KafkaSecurity:
        self.tries += 1
        if self.tries <= self.down:
            raise self.error
        return SECURITY

    async def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds

    def wait(self, settings: Settings, waiting: list[float] | None = None) -> KafkaSecurity:
        return asyncio.run(
            wait_for_kafka(
                settings, "the worker", check=self.check, sleep=self.sleep, clock=lambda: self.now,
                waiting=None if waiting is None else waiting.append,
            )
        )  # fmt: skip


DOWN = KafkaAccessError("cannot use Kafka over PLAINTEXT: h:9092: Connect call failed", transient=True)


def test_a_broker_that_is_down_is_waited_for_with_backoff_and_said_so_now_and_then(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = Broker(down=12, error=DOWN)
    waited: list[float] = []
    with caplog.at_level(logging.WARNING, "faultstream.kafka"):
        assert broker.wait(Settings(kafka_bootstrap="h:9092"), waited) is SECURITY
    assert broker.tries == 13
    assert broker.pauses[:4] == [0.5, 1.0, 2.0, 4.0] and max(broker.pauses) == LONGEST_PAUSE_SECONDS
    assert waited[-1] == 0.0 and max(waited) > 60  # the gauge: how long, then 0 once it answered
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("the worker waits for Kafka at h:9092, which does not answer (")
    assert "Connect call failed" in lines[0]
    assert any(line.startswith("the worker still waits for Kafka at h:9092 after") for line in lines)
    assert lines[-1].startswith("Kafka at h:9092 answered after")
    assert len(lines) < broker.tries  # now and then, not a line a try


def test_a_refusal_fails_at_once() -> None:
    refused = KafkaAccessError("the broker refused the login of user 'u'", transient=False)
    broker = Broker(down=5, error=refused)
    with pytest.raises(KafkaAccessError, match="refused the login"):
        broker.wait(Settings())
    assert broker.tries == 1 and not broker.pauses


def test_the_wait_is_bounded_when_asked() -> None:
    broker = Broker(down=10**6, error=DOWN)
    with pytest.raises(KafkaAccessError, match=r"waited \d+ s, \d+ tries; FAULTSTREAM_KAFKA_WAIT_SECONDS=20"):
        broker.wait(Settings(kafka_wait_seconds=20))
    assert 20 <= broker.now < 20 + LONGEST_PAUSE_SECONDS


def test_an_unknown_host_name_is_not_waited_for_but_a_closed_port_is() -> None:
    """The real check: no broker needed to tell a typo of a name from a port nobody listens on."""
    from stream.kafka.security import check_kafka

    with pytest.raises(KafkaAccessError) as unknown:
        asyncio.run(check_kafka(Settings(kafka_bootstrap="no-such-host.invalid:9092"), timeout_s=5))
    assert not unknown.value.transient
    with pytest.raises(KafkaAccessError) as closed:
        asyncio.run(check_kafka(Settings(kafka_bootstrap="127.0.0.1:1"), timeout_s=5))
    assert closed.value.transient
