"""A record that waits for the fleet stage: reported while it waits, let go when the wait cannot end.

A partition's event-time merge holds an XID that could storm until the fleet stage has decided its
day's storm baseline, and an ECC sample of a GPU without a trusted past until the stage has decided
its hour's ECC reference (docs/kafka.md#the-fleet-stage-results-that-do-not-depend-on-the-partitioning).
The stage decides once every partition's horizon has passed the instant, and a waiting record pins
its own partition's horizon past what it waits for, so on a healthy group the wait ends by
construction (``tests/unit/detectors/test_fleet.py`` drives the cores to a deadlock check). What
can still stop it is outside the cores: the worker that runs the stage is gone and nobody took
partition 0 over, a partition is assigned nowhere, a worker of an older version runs the stage.
Then the wait must not be silent nor endless (SPEC 5, liveness):

* after a quarter of ``FAULTSTREAM_WORKER_FLEET_WAIT_SECONDS`` the worker logs a warning naming the
  record, the decision it waits for and, on the stage's owner, the partitions the stage waits for;
* after the whole of it, if the stage has decided nothing meanwhile either (a stage that moves is
  slow, not stuck: a large backlog on another worker), the record goes without the decision
  (:meth:`~stream.worker.partition.PartitionWorker.decide_without_fleet`), said in an error line and
  counted in ``faultstream_fleet_decided_without_total``: results may then differ from a replay's.

``faultstream_fleet_wait_seconds{partition}`` shows each wait as it grows.
"""

from __future__ import annotations

import logging
import time

from detectors.fleet import FleetCore
from schemas.timeutil import format_ts
from stream.worker.partition import PartitionWorker

__all__ = ["FleetWaitWatch"]

_log = logging.getLogger("faultstream.worker")


class FleetWaitWatch:
    """Reports and ends the waits of a worker's partitions for the fleet stage.

    ``limit_seconds``: a wait this long, with no decision of the stage learnt during it, is let go
    (0: never).
    """

    def __init__(self, limit_seconds: float) -> None:
        self.limit_seconds = limit_seconds
        #: Monotonic time the worker last learnt a decision of the stage (a baseline or reference).
        self.last_decision = time.monotonic()

    def decided(self) -> None:
        """The worker learnt new decisions of the stage."""
        self.last_decision = time.monotonic()

    def waited(self, state: PartitionWorker, now: float) -> float:
        """Seconds the partition's next record has waited for the stage (0: it does not wait)."""
        return 0.0 if state.waiting_since is None else now - state.waiting_since

    def check(self, state: PartitionWorker, stage: FleetCore | None, now: float) -> bool:
        """Report a long wait of ``state`` once; return whether the record should go without the
        decision now (the caller calls :meth:`PartitionWorker.decide_without_fleet` and releases).
        ``stage``: the fleet stage, if this worker runs it."""
        waited = self.waited(state, now)
        limit = self.limit_seconds
        if waited <= 0 or limit <= 0:
            return False
        awaited = state.awaited()
        if awaited is None:
            return False
        what, period_ms, ts_ms = awaited
        if not state.wait_reported and waited >= limit / 4:
            state.wait_reported = True
            _log.warning(
                "partition %d: its next record (at %s) has waited %.0f s for the fleet stage's %s of "
                "the period from %s; %s. It goes without it after %.0f s with no decision of the stage.",
                state.partition, format_ts(ts_ms), waited, what, format_ts(period_ms), _stage_says(stage),
                limit,
            )  # fmt: skip
        quiet = now - max(self.last_decision, state.waiting_since or now)
        if waited < limit or quiet < limit:
            return False
        _log.error(
            "partition %d: the record at %s waited %.0f s for the fleet stage's %s of the period from "
            "%s and the stage decided nothing for %.0f s: it goes without it (%s), so results may "
            "differ from a replay's; %s",
            state.partition, format_ts(ts_ms), waited, what, format_ts(period_ms), quiet,
            "no reference: the GPU against its own past" if what == "ECC reference" else
            "a baseline of 0: the GPU's own counts", _stage_says(stage),
        )  # fmt: skip
        return True


def _stage_says(stage: FleetCore | None) -> str:
    if stage is None:
        return (
            "the stage runs on the worker that owns input partition 0: check that one is assigned it "
            "and its log, and faultstream_fleet_behind there"
        )
    behind = stage.holding_back()
    if not behind:
        return "the stage (run here) waits for no partition"
    return (
        f"the stage (run here) waits for input partition(s) {behind}: check that they are assigned "
        "and read (faultstream_consumer_lag, faultstream_merge_held_records)"
    )
