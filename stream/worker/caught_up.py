"""Whether a group of workers has done all it was given, read off their ``/metrics`` pages.

Committed offsets at the end of the input topics are not enough: a commit point writes the
records the event-time merge still holds (waiting for the fleet stage, say) into the checkpoint
and commits past them, so a worker can have committed everything and still have records to run
through the detection core. The tests, the chaos harness and ``benchmarks/worker_throughput.py``
call a group done when its offsets are committed *and* :func:`caught_up_on_gauges` says so.
"""

from __future__ import annotations

__all__ = ["PENDING_GAUGES", "caught_up_on_gauges", "metric_sum"]

#: Gauges that are 0 on every worker of a group that has done all its work.
PENDING_GAUGES = (
    "faultstream_merge_held_records",
    "faultstream_uncommitted",
    "faultstream_fleet_behind",
    "faultstream_fleet_idle_pending",
)


def metric_sum(page: str, name: str, label: str = "") -> float:
    """Sum of a metric's samples on a /metrics page (0.0 if it has none); ``label`` (``key="value"``):
    only the samples that carry it.

    >>> page = 'a{p="0"} 2.0\\na{p="1"} 3.0\\nab 7.0\\n'
    >>> metric_sum(page, "a"), metric_sum(page, "a", 'p="1"')
    (5.0, 3.0)
    """
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line.startswith(name) and (line[len(name)] in " {") and label in line
    )


def caught_up_on_gauges(pages: list[str | None]) -> bool:
    """Whether the workers' /metrics pages (None: a worker whose endpoint does not answer) say
    the group has done all it was given: each worker's assignment settled (its gauges cover all
    it owns), nothing held or short of a commit point, and the fleet stage has read every message
    the workers sent it — the stage owner's next offset to read (-1 on the others) against the
    fleet topic's offset after each one's last acknowledged message. (``faultstream_fleet_behind``
    alone is not enough: it compares with the end offset as last asked, and a hand-over sent
    since then, another worker's or the owner's own last one, is not in it.)"""
    if any(page is None for page in pages):
        return False
    ready = [page for page in pages if page is not None]
    if any(metric_sum(page, "faultstream_assignment_settled") != 1 for page in ready):
        return False
    if any(metric_sum(page, name) for page in ready for name in PENDING_GAUGES):
        return False
    read = max((metric_sum(page, "faultstream_fleet_read_offset") for page in ready), default=-1)
    return read >= max((metric_sum(page, "faultstream_fleet_sent_offset") for page in ready), default=0)
