"""Crash-looping users: users whose jobs crash wherever they run (job-aware verdicts, issue 19).

``crash_loop_user``
    A user of their own (after the cluster's regular users) who submits
    ``crash_loop_jobs_per_day`` short single-node jobs a day, each ending FAILED a few minutes in
    with application XIDs (13 or 43) on its node: a debug script that dies the same way on every
    node the scheduler gives it. Nothing is wrong with those nodes; draining one would fix nothing,
    the next job crashes elsewhere. The scheduler spreads them over the fleet, so they also land
    on lemon nodes (a node with a real fault *and* a crash-looping user's failures).

``crash_loop_failed_fraction``, ``crash_loop_max_lines``
    A debug session rather than a loop: only this share of their jobs fail (the rest complete),
    and a failure logs one to ``crash_loop_max_lines`` lines on one GPU, no storm
    (:mod:`stream.simulator.kernel_lines`).

``crash_loop_pinned_users``
    The first of them run every job on one node of their own (drawn at random: a debug node
    they name with ``--nodelist``), the issue's case: the same node sees their crash loop day
    after day while other users' jobs there complete. The scheduler starts a pinned job as soon
    as its node is free, before the queue (:func:`crash_loop_pins`).

A crash-looping user is not a fault of a node: the truth lists them apart
(``crash_loop_users``), and ``faultstream evaluate`` counts how many got an incident addressed
to them and how many false lemon verdicts the fleet got.

:func:`add_crash_loops` appends their submissions to the regular demand before the cluster runs;
:mod:`stream.simulator.kernel_lines` writes each of their failed jobs' XIDs.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from schemas.timeutil import MINUTE_MS
from stream.simulator.config import SECOND_MS, SimulationConfig
from stream.simulator.workload import JOB_NAMES, Demand, JobOutcome, user_count

__all__ = ["CRASH_LOOP_XIDS", "add_crash_loops", "crash_loop_pins", "crash_loop_user_names"]

#: The application XIDs a crash-looping job dies with (code, weight): an illegal memory access
#: (13) or a driver-killed context (43), as the issue's debug jobs showed.
CRASH_LOOP_XIDS: Final[tuple[tuple[int, float], ...]] = ((13, 0.6), (43, 0.4))

# A crash-looping job runs this long before it dies (uniform).
_RUN_MIN_MS: Final = 3 * MINUTE_MS
_RUN_MAX_MS: Final = 40 * MINUTE_MS
_GPU_CHOICES: Final[tuple[int, ...]] = (1, 2, 4, 8)


def crash_loop_user_names(config: SimulationConfig) -> tuple[str, ...]:
    """Names of the crash-looping users: the ones after the regular users.

    >>> crash_loop_user_names(SimulationConfig(nodes=64, crash_loop_users=2))
    ('user009', 'user010')
    """
    first = user_count(config)
    return tuple(f"user{first + k + 1:03d}" for k in range(config.crash_loop_users))


def add_crash_loops(
    config: SimulationConfig, arrivals: npt.NDArray[np.int64], demand: Demand, rng: np.random.Generator
) -> tuple[npt.NDArray[np.int64], Demand]:
    """The demand with the crash-looping users' submissions merged in, in arrival order.

    Without crash-looping users the arrivals and demand are returned as they are (the rest of
    the simulation draws nothing more, so its output is unchanged).
    """
    if config.crash_loop_users == 0:
        return arrivals, demand
    first = user_count(config)
    days = config.span_ms / (24 * 60 * MINUTE_MS)
    counts = rng.poisson(config.crash_loop_jobs_per_day * days, size=config.crash_loop_users)
    count = int(counts.sum())
    users = np.repeat(np.arange(first, first + config.crash_loop_users, dtype=np.int64), counts)
    submit = np.sort(rng.integers(0, config.span_ms // SECOND_MS, size=count)) * SECOND_MS + config.start_ms
    runtime = rng.integers(_RUN_MIN_MS // SECOND_MS, _RUN_MAX_MS // SECOND_MS, size=count) * SECOND_MS
    gpus = np.array(_GPU_CHOICES, dtype=np.int64)[rng.integers(0, len(_GPU_CHOICES), size=count)]
    gpus = np.minimum(gpus, config.gpus_per_node)
    outcome = np.full(count, JobOutcome.FAILED, dtype=np.int64)
    if config.crash_loop_failed_fraction < 1.0:  # drawn only then: the default draws nothing more
        completed = rng.random(count) >= config.crash_loop_failed_fraction
        outcome[completed] = JobOutcome.COMPLETED
    extra = Demand(
        nnodes=np.ones(count, dtype=np.int64),
        gpus=gpus.astype(np.int64),
        runtime_ms=runtime.astype(np.int64),
        outcome=outcome,
        user=users,
        name=np.full(count, JOB_NAMES.index("interactive"), dtype=np.int64),
        process=rng.integers(0, 3, size=count, dtype=np.int64),
        exit_code=np.zeros(count, dtype=np.int64),  # "1:0"
        cancel_kind=np.ones(count),
    )
    # A stable merge: the regular jobs keep their relative order, ties go to the regular job.
    merged = np.concatenate([arrivals, submit.astype(np.int64)])
    order = np.argsort(merged, kind="stable")
    joined = Demand(
        **{
            name: np.concatenate([getattr(demand, name), getattr(extra, name)])[order]
            for name in Demand.__dataclass_fields__
        }
    )
    return merged[order], joined


def crash_loop_pins(config: SimulationConfig, rng: np.random.Generator) -> dict[int, int]:
    """The pinned crash-looping users: user number -> the node every one of their jobs runs on.

    The first ``crash_loop_pinned_users`` crash-looping users, each on a node of their own, drawn
    after :func:`add_crash_loops`'s draws (nothing is drawn without pinned users).

    >>> config = SimulationConfig(nodes=64, crash_loop_users=2, crash_loop_pinned_users=1)
    >>> pins = crash_loop_pins(config, np.random.default_rng(0))
    >>> list(pins) == [user_count(config)], 0 <= pins[user_count(config)] < 64
    (True, True)
    """
    if config.crash_loop_pinned_users == 0:
        return {}
    first = user_count(config)
    nodes = rng.choice(config.nodes, size=config.crash_loop_pinned_users, replace=False)
    return {first + k: int(node) for k, node in enumerate(nodes.tolist())}
