"""MTTF exposure of job runs: partial rows per tumbling window (SPEC 3).

Every job run contributes its node-, GPU- and job-hours to each window it overlaps, as
:class:`~schemas.outputs.MttfPartial` rows that ClickHouse sums. :class:`ExposureTracker` writes
them when the event-time watermark closes a window (for the runs still running), when a run ends
(the rest of its exposure, with the end and, for a failure attributed to hardware, the failure)
and at the end of the input (what running runs accrued so far).

Rows are versioned so that replaying or continuing never double counts: a later, longer row of
the same run and window replaces an earlier one.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from detectors.jobs import JobRun
from detectors.mttf import SizeBuckets, window_slices
from schemas.outputs import MttfPartial
from schemas.records import JobState
from schemas.timeutil import HOUR_MS

__all__ = ["ExposureTracker"]

_FAILURE_STATES = frozenset({JobState.FAILED, JobState.NODE_FAIL, JobState.OUT_OF_MEMORY, JobState.TIMEOUT})


class ExposureTracker:
    """Tumbling MTTF windows, closed as the watermark passes them, and the rows of each run.

    Parameters
    ----------
    windows_s
        Window lengths in seconds.
    size_buckets
        Job-size buckets for the rows.

    Examples
    --------
    >>> exposure = ExposureTracker((3600,), SizeBuckets())
    >>> exposure.start_clock(first_event_ms=0)
    >>> run = JobRun("c", "7", start_ms=1_800_000, nodes=("n1",), gpus=8)
    >>> [(r.window_start_ms, r.gpu_hours) for r in exposure.close_windows(3_600_000, [run])]
    [(0, 4.0)]
    >>> [(r.window_start_ms, r.gpu_hours, r.jobs_ended)
    ...  for r in exposure.run_ended(run, 5_400_000, JobState.COMPLETED)]
    [(3600000, 4.0, 1)]
    """

    def __init__(self, windows_s: Sequence[int], size_buckets: SizeBuckets) -> None:
        self.window_ms = tuple(seconds * 1000 for seconds in windows_s)
        self.size_buckets = size_buckets
        self._next_close: list[int] | None = None

    @property
    def longest_window_ms(self) -> int:
        """Length of the longest window (0 without windows)."""
        return max(self.window_ms, default=0)

    @property
    def next_close_ms(self) -> int | None:
        """Event time at which the next window closes; None before :meth:`start_clock`."""
        return min(self._next_close) if self._next_close else None

    def start_clock(self, first_event_ms: int) -> None:
        """Align the windows on the first event: each closes at the next multiple of its length."""
        self._next_close = [first_event_ms - first_event_ms % w + w for w in self.window_ms]

    def close_windows(self, watermark_ms: int, running: Collection[JobRun]) -> list[MttfPartial]:
        """Close every window that ends at or before ``watermark_ms``: a row for each running run."""
        assert self._next_close is not None, "start_clock() first"
        rows: list[MttfPartial] = []
        for index, window_ms in enumerate(self.window_ms):
            while self._next_close[index] <= watermark_ms:
                close = self._next_close[index]
                for run in running:
                    row = self._window_row(run, index, close)
                    if row is not None:
                        rows.append(row)
                self._next_close[index] = close + window_ms
        return rows

    def run_ended(
        self, run: JobRun, end_ms: int, state: JobState, *, hardware_failure: bool = False
    ) -> list[MttfPartial]:
        """Final rows of a run that ended: the exposure not yet emitted, the end and any failure."""
        return self._rows(run, end_ms, state, final=True, failure=hardware_failure)

    def run_so_far(self, run: JobRun, until_ms: int) -> list[MttfPartial]:
        """Rows of a run still running, up to ``until_ms``, that any later row of it replaces."""
        return self._rows(run, until_ms, None, final=False)

    def _window_row(self, run: JobRun, index: int, close_ms: int) -> MttfPartial | None:
        """The row of a running run in the window closing at ``close_ms``; None if it started later."""
        window_start = close_ms - self.window_ms[index]
        begin = max(run.start_ms, window_start)
        run.covered_ms[index] = close_ms
        if begin >= close_ms:
            return None
        return self._partial(run, index, window_start, close_ms - begin, close_ms * 4)

    def _rows(
        self, run: JobRun, end_ms: int, state: JobState | None, *, final: bool, failure: bool = False
    ) -> list[MttfPartial]:
        rows: list[MttfPartial] = []
        for index, window_ms in enumerate(self.window_ms):
            begin = max(run.start_ms, run.covered_ms.get(index, run.start_ms))
            slices = list(window_slices(begin, end_ms, window_ms))
            if not slices and final:
                slices = [(end_ms - end_ms % window_ms, 0)]
            for number, (window_start, overlap_ms) in enumerate(slices):
                last = number == len(slices) - 1
                ended = final and last
                rows.append(
                    self._partial(
                        run,
                        index,
                        window_start,
                        overlap_ms,
                        # A window the run outlived is the row its close makes (the fleet stage
                        # can learn of the end before the watermark closes the window: the same
                        # row either way). Else later coverage wins; at the end, a final row wins
                        # over a running one and a hardware verdict over none (a job spanning
                        # partitions is judged by each with its own nodes' evidence).
                        (window_start + window_ms) * 4
                        if final and not last
                        else end_ms * 4 + 2 * int(final) + int(ended and failure),
                        ended=ended,
                        failed=ended and state in _FAILURE_STATES,
                        failure=ended and failure,
                    )
                )
        return rows

    def _partial(
        self,
        run: JobRun,
        index: int,
        window_start_ms: int,
        overlap_ms: int,
        version: int,
        *,
        ended: bool = False,
        failed: bool = False,
        failure: bool = False,
    ) -> MttfPartial:
        hours = overlap_ms / HOUR_MS
        buckets = self.size_buckets
        return MttfPartial(
            window_seconds=self.window_ms[index] // 1000,
            window_start_ms=window_start_ms,
            cluster=run.cluster,
            size_bucket=buckets.label(run.gpus),
            job_id=run.job_id,
            run_start_ms=run.start_ms,
            size_bucket_min_gpus=buckets.lower_bound(run.gpus),
            node_hours=len(run.nodes) * hours if run.nodes else hours,
            gpu_hours=run.gpus * hours,
            job_hours=hours,
            jobs_ended=int(ended),
            jobs_failed=int(failed),
            failures=int(failure),
            version=version,
        )
