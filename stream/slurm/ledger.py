"""What the job collector has published, and where its next ``sacct`` window starts.

Polling ``sacct`` over overlapping windows returns a job again and again: every poll while it runs,
and once more in the overlap after it ended. :class:`JobEventLedger` keeps the key of every event
published — ``(cluster, job id, state, time)``, so a requeued job's second run (same id, another
start) is an event of its own — and answers which events of a poll are new. A key is forgotten
once sacct no longer returns it and its time is before the window: it cannot come back.

:class:`Cursor` is the end of the last window whose events Kafka acknowledged, in a small JSON file
written atomically (temporary file, fsync, rename) after the acknowledgement: a restart resumes the
window there (less the overlap), so nothing ended while the collector was away is missed. The
ledger itself is not in the file: after a restart the collector reads its own events back from the
jobs topic (the topic is the record of what was published, :func:`ledger_keys_of_line`), so a crash
between publishing and writing the cursor repeats nothing.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import orjson

from schemas.records import InvalidRecord, JobEvent
from stream.kafka.codec import decode_record

__all__ = ["Cursor", "CursorError", "EventKey", "JobEventLedger", "event_key", "ledger_keys_of_line"]

#: A published event's identity.
EventKey = tuple[str, str, str, int]


def event_key(event: JobEvent) -> EventKey:
    """The ledger key of an event: cluster, job id, state and time.

    >>> from schemas.records import JobState
    >>> event_key(JobEvent(ts_ms=5, cluster="c", job_id="7", state=JobState.FAILED))
    ('c', '7', 'FAILED', 5)
    """
    return (event.cluster, event.job_id, event.state.value, event.ts_ms)


def ledger_keys_of_line(line: bytes) -> EventKey | None:
    """The key of one line of the jobs topic if it is a faultstream job event, else None (a Slurm
    ``jobcomp`` record, garbage: other producers' lines are not the collector's).

    >>> ledger_keys_of_line(b'{"ts": 1704067200000, "cluster": "c", "job_id": "7", "state": "FAILED"}')
    ('c', '7', 'FAILED', 1704067200000)
    >>> ledger_keys_of_line(b'{"jobid": 7}') is None
    True
    """
    try:
        event = decode_record("job", line, "", "")
    except InvalidRecord:
        return None
    return event_key(event)


class JobEventLedger:
    """The keys of the events published and still returned by sacct (or inside the window)."""

    def __init__(self) -> None:
        self._keys: set[EventKey] = set()

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def remember(self, key: EventKey) -> None:
        """Count ``key`` as published (an event read back from the topic, or just acknowledged)."""
        self._keys.add(key)

    def new_events(self, events: list[JobEvent]) -> list[JobEvent]:
        """The events of a poll not yet published, once each, in time order (a job's RUNNING
        before its end).

        >>> from schemas.records import JobState
        >>> ledger = JobEventLedger()
        >>> run = JobEvent(ts_ms=1, cluster="c", job_id="7", state=JobState.RUNNING)
        >>> end = JobEvent(ts_ms=9, cluster="c", job_id="7", state=JobState.FAILED)
        >>> [e.state.value for e in ledger.new_events([end, run, run])]
        ['RUNNING', 'FAILED']
        >>> ledger.remember(event_key(run)); [e.state.value for e in ledger.new_events([run, end])]
        ['FAILED']
        """
        fresh: dict[EventKey, JobEvent] = {}
        for event in events:
            key = event_key(event)
            if key not in self._keys:
                fresh.setdefault(key, event)
        return sorted(fresh.values(), key=lambda event: (event.ts_ms, event.state is not event.state.RUNNING))

    def forget(self, returned: set[EventKey], window_start_ms: int) -> int:
        """Forget the keys sacct did not return this time and whose time is before the window;
        returns how many.

        >>> ledger = JobEventLedger()
        >>> ledger.remember(("c", "7", "FAILED", 5)); ledger.remember(("c", "8", "RUNNING", 5))
        >>> ledger.forget({("c", "8", "RUNNING", 5)}, 10), len(ledger)
        (1, 1)
        """
        gone = {key for key in self._keys if key not in returned and key[3] < window_start_ms}
        self._keys -= gone
        return len(gone)


class CursorError(Exception):
    """The cursor file exists but cannot be read or written; the message says which and why."""


@dataclass(frozen=True)
class Cursor:
    """The collector's cursor file: the end of the last window Kafka acknowledged."""

    path: Path

    def load(self) -> int | None:
        """The saved window end (epoch ms), None when there is no file yet.

        Raises
        ------
        CursorError
            The file is there but unreadable or not a cursor (never guessed over: the operator
            decides, by fixing or removing it).
        """
        try:
            text = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CursorError(f"cannot read the cursor file {self.path}: {exc.strerror}") from None
        try:
            data = orjson.loads(text)
            until = data["until_ms"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise CursorError(
                f'{self.path} is not a cursor file (expected {{"until_ms": ...}}); fix or remove it '
                "(removed, the collector starts FAULTSTREAM_SLURM_BACKFILL_SECONDS back)"
            ) from None
        if not isinstance(until, int) or isinstance(until, bool) or until < 0:
            raise CursorError(f"{self.path}: until_ms must be epoch milliseconds, got {until!r}")
        return until

    def save(self, until_ms: int) -> None:
        """Write the window end atomically: a crash leaves the old cursor or the new one."""
        folder = self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=folder)
            try:
                with os.fdopen(handle, "wb") as out:
                    out.write(orjson.dumps({"until_ms": until_ms}) + b"\n")
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(temporary, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise
        except OSError as exc:
            raise CursorError(f"cannot write the cursor file {self.path}: {exc.strerror}") from None
