"""``faultstream notify``: the incidents topic as Alertmanager alerts (API v2, ``/api/v2/alerts``).

One alert per incident id. Alertmanager tells alerts apart by their label set, so the labels are
the incident's identity and routing keys (``alertname``, ``incident_id``, ``severity``, ``kind``,
``cluster``, ``node``, ``gpu``), and what changes with each update goes into annotations
(``summary``, ``action``, ``evidence_count``, ``version``...). Posting an update again under the
same labels updates the one alert; a resolved incident is posted with ``endsAt`` = now, which
resolves it. Should an update change a label (severity raised), the alert under the old labels
is resolved in the same post, so one incident never shows twice.

Delivery: the notifier reads the topic with its own consumer group and commits a partition's
offsets only after Alertmanager accepted (HTTP 200) the post holding those messages, so nothing
is missed while it or Alertmanager is down; Alertmanager merges repeats, so the at-least-once
redelivery after a restart costs nothing. Open alerts carry ``endsAt`` = now + 4 x the re-send
interval and are posted again every interval (Prometheus' own rule), so an alert stays active
exactly while the notifier runs and its incident is open, and expires by itself if the notifier
is gone for good. To know which incidents are open after a restart, it first reads the topic
from its beginning up to the committed offsets (updating its state, posting nothing new), then
posts the open ones and carries on live.

The topic is keyed by node, so the updates of an incident arrive in order on one partition; an
update older than one already seen (a worker's repeat) is ignored by its ``version``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaConnectionError, KafkaError

from stream.kafka.tail import owner_of

__all__ = ["ALERTNAME", "AlertState", "NotifyError", "NotifyOptions", "notify", "run", "to_alert"]

_log = logging.getLogger(__name__)

#: The ``alertname`` of every incident alert (route on it, or on ``severity`` and ``kind``).
ALERTNAME = "FaultstreamIncident"
#: Open alerts end this many re-send intervals after each post unless posted again.
_TTL_INTERVALS = 4


class NotifyError(Exception):
    """The notifier cannot run: no broker, no topic, bad arguments."""


@dataclass(frozen=True)
class NotifyOptions:
    """What ``faultstream notify`` reads, where it posts, and how often it re-sends."""

    bootstrap: str
    topic: str
    group: str
    alertmanager: str  # base URL, e.g. http://alertmanager:9093
    resend_s: float = 60.0
    connect_timeout_s: float = 15.0
    retry_s: float = 5.0  # wait before posting again after Alertmanager refused or was unreachable


def _iso(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _ms(iso: object) -> int | None:
    try:
        return round(datetime.fromisoformat(str(iso).replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None


def to_alert(incident: dict[str, Any], now_ms: int, ttl_ms: int) -> dict[str, Any]:
    """The Alertmanager alert of one incident message, as of ``now_ms`` (wall clock).

    ``startsAt`` is the incident's first evidence (event time; never after now); ``endsAt`` is now
    for a resolved incident, else ``now + ttl``.

    Examples
    --------
    >>> alert = to_alert({"incident_id": "i1", "kind": "gpu_bus", "severity": "critical",
    ...                   "status": "open", "cluster": "c", "node": "n7", "gpu": "0000:07:00",
    ...                   "first_evidence": "2024-01-03T10:00:00.000Z", "summary": "XID 79",
    ...                   "action": "drain", "evidence_count": 1, "version": 2}, 1_704_276_060_000, 60_000)
    >>> alert["labels"]["severity"], alert["annotations"]["evidence_count"], alert["endsAt"]
    ('critical', '1', '2024-01-03T10:02:00.000Z')
    """
    labels = {
        "alertname": ALERTNAME,
        "incident_id": str(incident["incident_id"]),
        "severity": str(incident.get("severity", "")),
        "kind": str(incident.get("kind", "")),
        "cluster": str(incident.get("cluster", "")),
        "node": str(incident.get("node", "")),
        "gpu": str(incident.get("gpu") or ""),
        # An owner's incident (job_app_errors, job_xid_storm) is addressed to its jobs' owner: a route
        # can send it to them.
        "owner": owner_of(incident),
    }
    annotations = {
        "summary": str(incident.get("summary", "")),
        "action": str(incident.get("action", "")),
        "evidence_count": str(incident.get("evidence_count", "")),
        "status": str(incident.get("status", "")),
        "version": str(incident.get("version", "")),
        "first_evidence": str(incident.get("first_evidence", "")),
        "last_evidence": str(incident.get("last_evidence", "")),
        "detector": str(incident.get("detector", "")),
    }
    first = _ms(incident.get("first_evidence"))
    starts = now_ms if first is None else min(first, now_ms)
    ends = now_ms if incident.get("status") == "resolved" else now_ms + ttl_ms
    return {
        # Alertmanager drops labels with empty values; keep the set identical on every post.
        "labels": {key: value for key, value in labels.items() if value},
        "annotations": {key: value for key, value in annotations.items() if value},
        "startsAt": _iso(starts),
        "endsAt": _iso(ends),
    }


@dataclass
class AlertState:
    """The newest version seen of each incident, and the open ones' newest message."""

    versions: dict[str, int] = field(default_factory=dict)
    open: dict[str, dict[str, Any]] = field(default_factory=dict)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)

    def apply(self, value: bytes | None) -> dict[str, Any] | None:
        """Take one message; return the incident if it is news (a newer version), else None."""
        try:
            incident = orjson.loads(value or b"")
            incident_id = str(incident["incident_id"])
            version = int(incident.get("version", 0))
        except (orjson.JSONDecodeError, TypeError, KeyError, ValueError):
            _log.warning("skipped a message that is not an incident: %r", (value or b"")[:80])
            return None
        if self.versions.get(incident_id, -1) >= version:
            return None  # a repeat (at-least-once) or an older update
        self.versions[incident_id] = version
        if incident.get("status") == "resolved":
            self.open.pop(incident_id, None)
        else:
            self.open[incident_id] = incident
        return dict(incident)

    def alerts(self, incidents: list[dict[str, Any]], now_ms: int, ttl_ms: int) -> list[dict[str, Any]]:
        """The alerts to post for these incidents: each one's alert, and the old labels resolved
        where an update changed them."""
        out = []
        for incident in incidents:
            alert = to_alert(incident, now_ms, ttl_ms)
            incident_id = str(incident["incident_id"])
            before = self.labels.get(incident_id)
            if before is not None and before != alert["labels"]:
                out.append({**alert, "labels": before, "endsAt": _iso(now_ms)})
            if incident.get("status") == "resolved":
                self.labels.pop(incident_id, None)
            else:
                self.labels[incident_id] = alert["labels"]
            out.append(alert)
        return out


def post_alerts(base_url: str, alerts: list[dict[str, Any]], timeout_s: float = 10.0) -> None:
    """POST the alerts to Alertmanager's API v2; raise ``OSError`` unless it answered 200."""
    request = urllib.request.Request(
        base_url.rstrip("/") + "/api/v2/alerts",
        data=orjson.dumps(alerts),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            if response.status != 200:
                raise OSError(f"HTTP {response.status}")
    except urllib.error.HTTPError as exc:
        body = exc.read()[:200].decode(errors="replace")
        raise OSError(f"HTTP {exc.code}: {body.strip()}") from None


class _Notifier:
    def __init__(self, options: NotifyOptions, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> None:
        self.options = options
        self.consumer = consumer
        self.stop = stop
        self.state = AlertState()
        self.ttl_ms = int(options.resend_s * _TTL_INTERVALS * 1000)
        self.posted = 0

    async def post(self, incidents: list[dict[str, Any]], *, refresh: bool = False) -> bool:
        """Post until Alertmanager accepts (True): a refused or failed post is retried, never
        dropped; False if told to stop first (nothing is committed then)."""
        # On a refresh the open news come with all the open ones: each incident once a post.
        first = [i for i in incidents if not refresh or i.get("status") == "resolved"]
        alerts = self.state.alerts(first, int(time.time() * 1000), self.ttl_ms)
        while True:
            now = int(time.time() * 1000)
            if refresh:
                alerts += self.state.alerts(list(self.state.open.values()), now, self.ttl_ms)
                refresh = False
            if not alerts:
                return True
            try:
                await asyncio.to_thread(post_alerts, self.options.alertmanager, alerts)
            except OSError as exc:
                _log.warning(
                    "Alertmanager at %s did not take %d alerts (%s); retrying in %.0f s",
                    self.options.alertmanager, len(alerts), exc, self.options.retry_s,
                )  # fmt: skip
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), self.options.retry_s)
                if self.stop.is_set():
                    return False
                refresh = True  # re-made with fresh end times (the open ones include the news)
                alerts = [a for a in alerts if a["endsAt"] <= _iso(now)]  # keep the resolutions
                continue
            self.posted += len(alerts)
            return True

    async def catch_up(self, partitions: list[TopicPartition]) -> None:
        """Read from the beginning to the committed offsets: the state as of the last post."""
        committed = {tp: (await self.consumer.committed(tp)) or 0 for tp in partitions}
        await self.consumer.seek_to_beginning(*partitions)
        remaining = [tp for tp in partitions if committed[tp] > 0]
        while remaining and not self.stop.is_set():
            batches = await self.consumer.getmany(*remaining, timeout_ms=500, max_records=1000)
            for tp, messages in batches.items():
                for message in messages:
                    if message.offset < committed[tp]:
                        self.state.apply(message.value)
            for tp in list(remaining):
                if await self.consumer.position(tp) >= committed[tp]:
                    self.consumer.seek(tp, committed[tp])  # live from the committed offset on
                    remaining.remove(tp)

    async def run(self, partitions: list[TopicPartition]) -> None:
        await self.catch_up(partitions)
        if not await self.post([], refresh=True):
            return
        last_refresh = time.monotonic()
        while not self.stop.is_set():
            batches = await self.consumer.getmany(timeout_ms=500, max_records=500)
            news = [
                incident
                for messages in batches.values()
                for message in messages
                if (incident := self.state.apply(message.value)) is not None
            ]
            refresh = time.monotonic() - last_refresh >= self.options.resend_s
            if (news or refresh) and not await self.post(news, refresh=refresh):
                return  # stopped before Alertmanager took them: the next start posts them
            last_refresh = time.monotonic() if refresh else last_refresh
            if batches:  # only now: Alertmanager has everything before these offsets
                await self.consumer.commit(
                    {tp: messages[-1].offset + 1 for tp, messages in batches.items() if messages}
                )


async def notify(options: NotifyOptions, stop: asyncio.Event | None = None) -> int:
    """Forward incidents to Alertmanager until ``stop`` is set; return how many alerts were posted."""
    stop = stop or asyncio.Event()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=options.bootstrap,
        group_id=options.group,
        enable_auto_commit=False,
        request_timeout_ms=int(options.connect_timeout_s * 1000),
    )
    try:
        await asyncio.wait_for(consumer.start(), options.connect_timeout_s)
    except (TimeoutError, KafkaConnectionError, KafkaError) as exc:
        await consumer.stop()
        raise NotifyError(
            f"cannot reach Kafka at {options.bootstrap} ({exc or type(exc).__name__})"
        ) from None
    try:
        numbers = consumer.partitions_for_topic(options.topic)
        if not numbers:
            await consumer._client.force_metadata_update()  # first metadata may predate the topic
            numbers = consumer.partitions_for_topic(options.topic)
        if not numbers:
            raise NotifyError(
                f"topic {options.topic} does not exist on {options.bootstrap}; "
                "create it with `faultstream init-kafka` (or set FAULTSTREAM_TOPIC_INCIDENTS)"
            )
        # Every partition, assigned (no group rebalancing): one notifier sees all incidents. The
        # group only holds the committed offsets. Two notifiers both post; Alertmanager merges.
        partitions = [TopicPartition(options.topic, p) for p in sorted(numbers)]
        consumer.assign(partitions)
        notifier = _Notifier(options, consumer, stop)
        _log.warning(
            "notify: %s on %s -> %s (group %s, %d partitions)",
            options.topic, options.bootstrap, options.alertmanager, options.group, len(partitions),
        )  # fmt: skip
        await notifier.run(partitions)
        return notifier.posted
    finally:
        await consumer.stop()


def run(options: NotifyOptions, *, on_ready: Callable[[], None] | None = None) -> int:
    """Run the notifier until SIGTERM or Ctrl-C (both end it after its current post)."""

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        if on_ready is not None:
            on_ready()
        return await notify(options, stop)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
    return 0
