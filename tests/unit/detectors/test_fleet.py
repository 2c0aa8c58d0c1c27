"""The fleet stage: cores that each own part of the fleet, plus one stage, decide exactly what one
core owning every node decides — whatever the partitioning and the order the cores run in.

The records come from the project's simulator (real file formats, parsed by the real parsers).
Each record goes to the core that owns its node; a job goes to every core owning one of its
nodes (what the worker's re-keying does). The cores run in a random interleaving, each handing
its facts, failed runs and horizon to the stage and learning the storm baselines back — the
protocol the Kafka worker speaks over its fleet topic.
"""

from __future__ import annotations

import dataclasses
import itertools
import pickle
import random
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from detectors.core import CoreConfig, DetectionCore, Emitted, FleetBaselineMissing
from detectors.fleet import (
    ECC_FLAGGED,
    ECC_SBE,
    FROM_THE_START,
    NO_ECC_REFERENCE,
    PEAK,
    FleetConfig,
    FleetCore,
    FleetFact,
    JobPart,
    exact_quantile,
    healthy_ceiling,
)
from detectors.lemon import LemonConfig
from schemas.outputs import IncidentKind
from schemas.records import EccSample, JobEvent, Record, XidEvent
from schemas.timeutil import DAY_MS, HOUR_MS
from stream.inputs.files import MergedInputs
from stream.inputs.parsers.options import ParseOptions
from stream.simulator import simulate
from stream.simulator.config import SimulationConfig
from stream.simulator.matrix import TUNING_SEEDS, cell_config, cells_named

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "sim-48x14" / "logs"


@dataclass
class Outcome:
    """What a run decided, as ClickHouse keeps it (the highest version of each row)."""

    incidents: dict[str, Any]
    attributions: dict[tuple[str, str, int, int], Any]
    mttf: dict[tuple[Any, ...], Any]

    @classmethod
    def empty(cls) -> Outcome:
        return cls({}, {}, {})

    def add(self, emitted: Emitted) -> None:
        for incident in emitted.incidents:
            known = self.incidents.get(incident.incident_id)
            if known is None or incident.version >= known.version:
                self.incidents[incident.incident_id] = incident
        for a in emitted.attributions:
            key = (a.cluster, a.job_id, a.start_ms, a.end_ms)
            assert key not in self.attributions, f"job {a.job_id} attributed twice"
            self.attributions[key] = a
        for row in emitted.mttf:
            key = (
                row.window_seconds,
                row.window_start_ms,
                row.cluster,
                row.size_bucket,
                row.job_id,
                row.run_start_ms,
            )
            known = self.mttf.get(key)
            if known is None or row.version >= known.version:
                self.mttf[key] = row

    def incident_facts(self) -> list[tuple[Any, ...]]:
        return sorted(
            (i.incident_id, i.kind.value, i.severity.value, i.status.value, i.node, i.gpu, i.first_evidence_ms,
             i.last_evidence_ms, i.evidence_count)
            for i in self.incidents.values()
        )  # fmt: skip

    def mttf_sums(self) -> dict[tuple[int, str], tuple[float, int, int, int]]:
        sums: dict[tuple[int, str], list[float]] = {}
        for row in self.mttf.values():
            s = sums.setdefault((row.window_seconds, row.size_bucket), [0.0, 0, 0, 0])
            s[0] += row.gpu_hours
            s[1] += row.jobs_ended
            s[2] += row.jobs_failed
            s[3] += row.failures
        return {k: (round(v[0], 6), int(v[1]), int(v[2]), int(v[3])) for k, v in sums.items()}


def records_of(folder: Path) -> list[Record]:
    inputs = MergedInputs([folder], ParseOptions(year=2024), None, 5 * 60_000)
    return [item for item, _ in inputs if isinstance(item, XidEvent | EccSample | JobEvent)]


def partition_of(node: str, partitions: int) -> int:
    return zlib.crc32(node.encode()) % partitions


class Owner:
    """A picklable ownership predicate, like the worker's."""

    def __init__(self, partition: int, partitions: int) -> None:
        self.partition, self.partitions = partition, partitions

    def __call__(self, node: str) -> bool:
        return partition_of(node, self.partitions) == self.partition


def config() -> CoreConfig:
    # A shorter lemon history so that verdicts happen on short simulations too.
    return CoreConfig(lemon=LemonConfig(min_history_ms=3 * DAY_MS))


def embedded(records: list[Record]) -> Outcome:
    core = DetectionCore(config())
    out = Outcome.empty()
    for record in records:
        core.process(record)
        out.add(core.drain())
    out.add(core.finish())
    return out


def partitioned(
    records: list[Record],
    partitions: int,
    seed: int,
    ask_ecc: bool = True,
    held_back: list[int] | None = None,
    ecc_runs: bool = False,
    crashes: float = 0.0,
    checkpoints: float = 0.3,
    drains: float = 0.0,
) -> Outcome:
    """``partitions`` cores and one fleet stage, run in a random interleaving; now and then a core
    hands over its previous facts and failed runs again. ``ask_ecc=False``: ECC samples are not
    asked :meth:`DetectionCore.ready_for` but processed, and held on ``FleetBaselineMissing`` (the
    worker's way; ``held_back`` counts those). ``ecc_runs``: consecutive samples go in one
    :meth:`DetectionCore.process_ecc_run`, as the worker gives a run the merge released.
    ``crashes``: the chance that a core, after a hand-over, is restarted from its newest checkpoint
    (its core pickled, with its position), written after a hand-over with chance ``checkpoints``;
    it then processes again, and hands over again, everything since (a worker killed and its
    partition taken over). ``drains``: the chance that a core, after a hand-over, says it has
    nothing to read (as a worker does after FAULTSTREAM_WORKER_FLEET_IDLE_SECONDS of a drained
    partition), with its pending decisions, and reads on later."""
    cores = [DetectionCore(config(), owns=Owner(p, partitions), local_fleet=False) for p in range(partitions)]
    fleet = FleetCore(config().fleet_config(), partitions=partitions)
    queues: list[list[Record]] = [[] for _ in range(partitions)]
    for record in records:
        if isinstance(record, JobEvent):
            for p in sorted({partition_of(node, partitions) for node in record.nodes}):
                queues[p].append(record)
        else:
            queues[partition_of(record.node, partitions)].append(record)
    out = Outcome.empty()
    rng = random.Random(seed)
    positions = [0] * partitions
    for p in range(partitions):
        if not queues[p]:
            fleet.idle(p)  # a partition with nothing to read (the worker says so after a while)

    sent: list[tuple[list[FleetFact], list[JobPart]]] = [([], []) for _ in range(partitions)]
    # Each core's newest checkpoint: the pickled core, its position, its horizon.
    saved: list[tuple[bytes, int, int]] = [(pickle.dumps(core), 0, FROM_THE_START) for core in cores]
    learnt: tuple[dict[int, float], dict[int, float]] = ({}, {})  # every baseline and reference decided
    drained: dict[int, int] = {}  # cores that said they have nothing to read: their next record's time

    def hand_over(p: int) -> None:
        emitted = cores[p].drain()
        if rng.random() < 0.2:  # what a core restarted from its checkpoint does: repeat itself
            fleet.add(p, sent[p][0])
            for part in sent[p][1]:
                fleet.add_job(part)
        sent[p] = (emitted.facts, emitted.job_parts)
        fleet.add(p, emitted.facts)
        for part in emitted.job_parts:
            fleet.add_job(part)
        out.add(emitted)
        if emitted.fleet_horizon_ms is not None:
            fleet.advance(p, emitted.fleet_horizon_ms, saved[p][2])
        if positions[p] == len(queues[p]):
            fleet.idle(p, cores[p].has_pending_decisions)
        elif rng.random() < drains and all(
            queues[p][positions[p]].ts_ms >= (core.max_event_ms or 0) for core in cores
        ):
            # Nothing of it published yet beyond what the others read: drained, it says so.
            drained[p] = queues[p][positions[p]].ts_ms
            fleet.idle(p, cores[p].has_pending_decisions)
        decided = fleet.drain()
        out.add(Emitted(incidents=decided.incidents, attributions=decided.attributions, mttf=decided.mttf))
        learnt[0].update(decided.baselines)
        learnt[1].update(decided.ecc_references)
        for core in cores:
            core.learn_baselines(decided.baselines, decided.ecc_references)
        if rng.random() < checkpoints:
            horizon = cores[p].fleet_horizon_ms
            saved[p] = (pickle.dumps(cores[p]), positions[p], FROM_THE_START if horizon is None else horizon)

    # Liveness: a record waits only for what will come. Once every core with records left has
    # handed over without moving, nothing can move any more: a deadlock, which the worker's merge
    # would hold for good.
    stuck: set[int] = set()
    while any(positions[p] < len(queues[p]) for p in range(partitions)):
        live = [p for p in range(partitions) if positions[p] < len(queues[p])]
        if stuck.issuperset(live):
            waiting = {p: (queues[p][positions[p]].ts_ms, cores[p].fleet_horizon_ms) for p in live}
            raise AssertionError(
                f"deadlock: every core waits (next record, horizon): {waiting}; the stage's horizon "
                f"{fleet.horizon_ms}, next instant {fleet.next_instant_ms}"
            )
        p = rng.choice(live)
        drained.pop(p, None)  # its next record was published: it reads again
        before = positions[p]
        budget = rng.randint(1, 300)  # records until the next hand-over
        # A drained core's next record is published before any later one (a publisher keeps event
        # time order): the others read no further than it until the drained core reads again.
        published_to = min((ts for q, ts in drained.items() if q != p), default=2**63)
        while budget > 0 and positions[p] < len(queues[p]):
            record = queues[p][positions[p]]
            if record.ts_ms > published_to:
                break
            if ecc_runs and isinstance(record, EccSample):
                rest = itertools.islice(queues[p], positions[p], positions[p] + budget)
                run = list(
                    itertools.takewhile(
                        lambda r, to=published_to: isinstance(r, EccSample) and r.ts_ms <= to, rest
                    )
                )
                late, waiting = cores[p].process_ecc_run(run)
                assert not late
                done = len(run) if waiting is None else waiting
                positions[p] += done
                budget -= done
                if waiting is None:
                    continue
                assert held_back is not None
                held_back.append(positions[p])
                break  # the same wait, found by processing the run
            budget -= 1
            cores[p].advance(record.ts_ms)
            if (ask_ecc or not isinstance(record, EccSample)) and not cores[p].ready_for(record):
                break  # waits for the other cores' horizons
            try:
                cores[p].process(record)
            except FleetBaselineMissing:
                assert not ask_ecc and isinstance(record, EccSample)
                if held_back is not None:
                    held_back.append(positions[p])
                break  # the same wait, found by processing
            positions[p] += 1
        hand_over(p)
        if positions[p] > before:
            stuck.clear()  # a decision that moved one core may move the others
        else:
            stuck.add(p)
        if positions[p] < len(queues[p]) and rng.random() < crashes:
            cores[p] = pickle.loads(saved[p][0])
            positions[p] = saved[p][1]
            cores[p].learn_baselines(*learnt)  # what a worker's partition learns as it starts
            stuck.discard(p)
    # End of input: every core finishes, then the stage stops waiting for any of them.
    # The end of the input is the last event of any partition (one core's own last event).
    end = max(core.max_event_ms for core in cores if core.max_event_ms is not None)
    for p, core in enumerate(cores):
        finished = core.finish(end)
        fleet.add(p, finished.facts)
        for part in finished.job_parts:
            fleet.add_job(part)
        out.add(finished)
    for p in range(partitions):
        fleet.idle(p)
    decided = fleet.drain()
    out.add(Emitted(incidents=decided.incidents, attributions=decided.attributions, mttf=decided.mttf))
    return out


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Record]]:
    """The bundled example and four simulated clusters (32 to 400 nodes; two with under a week of
    history; one with job-aware cases: a user whose jobs crash wherever they run, one whose jobs
    all crash on one node, storms of jobs and of faulty GPUs; job-aware verdicts are fleet-wide
    too)."""
    found = {"example": records_of(EXAMPLE)}
    for name, sim in {
        "60 nodes x 20 days": SimulationConfig(nodes=60, days=20, seed=11, ecc_interval_minutes=720),
        "120 nodes x 5 days": SimulationConfig(
            nodes=120,
            days=5,
            seed=12,
            ecc_interval_minutes=720,
            crash_loop_users=2,
            crash_loop_pinned_users=1,
            xid_storm_rate=30.0,
            xid_storm_gpu_fraction=0.5,
        ),
        "400 nodes x 10 days": SimulationConfig(nodes=400, days=10, seed=13, ecc_interval_minutes=1440),
        # The matrix's short-history lemon cell: verdicts from 2 days on, every 6 hours.
        "32 nodes x 7 days": cell_config(cells_named(("lemon-many-32n-7d",))[0], seed=TUNING_SEEDS[0]),
        # Degradations under way when the history begins: GPUs compared with the fleet's ECC
        # reference, decided hourly, during their first two days (3 days of it here).
        "256 nodes x 3 days, degrading": dataclasses.replace(
            cell_config(cells_named(("ecc-quadratic-underway-15m-256n-4d",))[0], seed=TUNING_SEEDS[1]),
            days=3.0,
        ),
    }.items():
        folder = tmp_path_factory.mktemp("sim")
        simulate(sim, folder)
        found[name] = records_of(folder)
    return found


@pytest.mark.parametrize(
    "name",
    [
        "example",
        "60 nodes x 20 days",
        "120 nodes x 5 days",
        "400 nodes x 10 days",
        "256 nodes x 3 days, degrading",
    ],
)
@pytest.mark.parametrize(("partitions", "seed"), [(1, 1), (2, 2), (4, 3), (8, 4)])
def test_partitioned_cores_and_the_fleet_stage_decide_what_one_core_decides(
    clusters: dict[str, list[Record]], name: str, partitions: int, seed: int
) -> None:
    records = clusters[name]
    one = embedded(records)
    many = partitioned(records, partitions, seed)
    assert many.incident_facts() == one.incident_facts()
    assert many.attributions == one.attributions
    assert many.mttf_sums() == one.mttf_sums()
    assert one.incidents and one.attributions  # the comparison had something to compare


@pytest.mark.parametrize("name", ["60 nodes x 20 days", "256 nodes x 3 days, degrading"])
@pytest.mark.parametrize(("partitions", "seed"), [(1, 11), (4, 12)])
@pytest.mark.parametrize("ecc_runs", [False, True], ids=["one by one", "in runs"])
def test_ecc_samples_processed_without_asking_first_decide_what_one_core_decides(
    clusters: dict[str, list[Record]], name: str, partitions: int, seed: int, ecc_runs: bool
) -> None:
    """The worker does not ask whether an ECC sample needs the fleet's reference: it processes the
    sample, and holds it when the core raises, having changed nothing; or it gives the core a run
    of samples, which tells where the first that must wait is. Same decisions."""
    records = clusters[name]
    one = embedded(records)
    held_back: list[int] = []
    many = partitioned(records, partitions, seed, ask_ecc=False, held_back=held_back, ecc_runs=ecc_runs)
    assert many.incident_facts() == one.incident_facts()
    assert many.attributions == one.attributions
    assert many.mttf_sums() == one.mttf_sums()
    if "degrading" in name:  # its GPUs degrade before they have a past of their own
        assert held_back  # samples did wait for the reference, found by processing them


@pytest.fixture(scope="module")
def dense_month(tmp_path_factory: pytest.TempPathFactory) -> list[Record]:
    """A month of 10-minute DCGM scrapes (what a replay of a month of history or a catch-up after
    an outage holds), with a fifth of the GPUs correcting errors every few minutes from the first scrape on: their
    samples need the fleet's ECC reference from the history's first hour."""
    folder = tmp_path_factory.mktemp("dense")
    simulate(
        SimulationConfig(
            nodes=12, days=30, seed=7, ecc_interval_minutes=10, sbe_gpu_fraction=0.2, sbe_rate_per_day=96
        ),
        folder,
    )
    return records_of(folder)


@pytest.mark.parametrize(("partitions", "seed"), [(1, 21), (4, 22), (8, 23)])
def test_a_dense_month_drains_on_any_partitioning_and_decides_what_one_core_decides(
    dense_month: list[Record], partitions: int, seed: int
) -> None:
    """Liveness: every record waits only for a decision that will come. A sample ten minutes
    past the history's first midnight pins its core's horizon at midnight (lateness and the
    attribution window add up to ten minutes), and the stage's first instants were at midnight
    too, decided only once a horizon passed them: every core waited for good."""
    one = embedded(dense_month)
    held_back: list[int] = []
    many = partitioned(dense_month, partitions, seed, ask_ecc=False, held_back=held_back, ecc_runs=True)
    if partitions > 1:
        assert held_back  # samples did wait for the other cores' horizons
    assert many.incident_facts() == one.incident_facts()
    assert many.attributions == one.attributions
    assert many.mttf_sums() == one.mttf_sums()


@pytest.mark.parametrize(("partitions", "seed"), [(1, 31), (4, 32)])
def test_cores_restarted_from_checkpoints_days_old_hand_over_again_and_nothing_is_decided_twice(
    clusters: dict[str, list[Record]], partitions: int, seed: int
) -> None:
    """A core killed and restarted from its newest checkpoint hands over again everything since,
    however much event time that spans (a backlog's commit interval can cover days; the stage
    forgot a decided run two storm periods after its end, and attributed it again). The stage
    knows each core's checkpointed horizon and remembers what a core may repeat."""
    records = clusters["60 nodes x 20 days"]
    one = embedded(records)
    many = partitioned(records, partitions, seed, crashes=0.05, checkpoints=0.02)
    assert many.incident_facts() == one.incident_facts()
    assert many.attributions == one.attributions  # Outcome.add fails on a run attributed twice
    assert many.mttf_sums() == one.mttf_sums()


@pytest.mark.parametrize(("partitions", "seed", "drains"), [(4, 42, 0.5), (8, 41, 0.5), (8, 43, 0.9)])
def test_cores_drained_mid_stream_with_decisions_pending_hold_the_stage(
    clusters: dict[str, list[Record]], partitions: int, seed: int, drains: float
) -> None:
    """A partition with nothing to read for a while says so, and the stage stops waiting for it;
    one that still has failed runs to attribute holds the stage at its horizon while others are
    active. Passing it, two application failures of the crash-looping user came late and were
    dropped: the user's incident two versions short (the scale-out test's rare 250 for 252)."""
    records = clusters["120 nodes x 5 days"]
    one = embedded(records)
    many = partitioned(records, partitions, seed, drains=drains)
    assert many.incident_facts() == one.incident_facts()
    assert many.attributions == one.attributions
    assert many.mttf_sums() == one.mttf_sums()


def test_the_stage_decides_an_instant_its_horizon_has_reached() -> None:
    """The horizon is the time before which no more facts come: an instant at it is decided (all
    facts before it are in), and the first instants are never after the first horizon."""
    fleet = FleetCore(config().fleet_config(), partitions=1)
    midnight = 20 * DAY_MS
    fleet.add(0, [FleetFact(midnight, ECC_SBE, "n1", key="0000:07:00", value=3)])
    fleet.advance(0, midnight)
    assert fleet.ecc_reference(midnight) == NO_ECC_REFERENCE  # the first hour's: decided
    assert fleet.baseline(midnight) == 0.0
    later = FleetCore(config().fleet_config(), partitions=1)
    later.add(0, [FleetFact(midnight + 5 * 60_000, ECC_SBE, "n1", key="0000:07:00", value=3)])
    later.advance(0, midnight - 5 * 60_000)  # the facts come after the horizon: days start before it
    assert later.ecc_reference(midnight) is not None
    assert later.baseline(midnight) is not None


def test_the_simulated_clusters_have_lemons_storms_and_cross_partition_jobs(
    clusters: dict[str, list[Record]],
) -> None:
    """The equality above is worth something only if the fleet-wide decisions happen at all."""
    kinds = {i.kind for i in embedded(clusters["60 nodes x 20 days"]).incidents.values()}
    assert IncidentKind.LEMON_NODE in kinds
    kinds = {i.kind for i in embedded(clusters["400 nodes x 10 days"]).incidents.values()}
    # The simulator's default storms are application XIDs of the one job on their node: the job's.
    assert {IncidentKind.LEMON_NODE, IncidentKind.JOB_XID_STORM} <= kinds
    aware = embedded(clusters["120 nodes x 5 days"]).incidents.values()
    crash_loops = {i.evidence["owner"]: i for i in aware if i.kind is IncidentKind.JOB_APP_ERRORS}
    # The crash-looping users, after 15 regular: user016's jobs all run on one node, user017's anywhere.
    assert sorted(crash_loops) == ["user016", "user017"]
    assert len(crash_loops["user016"].evidence["nodes"]) == 1 < len(crash_loops["user017"].evidence["nodes"])
    pinned = crash_loops["user016"].evidence["nodes"][0]
    assert not [i for i in aware if i.kind is IncidentKind.LEMON_NODE and i.node == pinned]
    # Storms of jobs go to their owners, storms of faulty GPUs are the GPUs': both kinds happen.
    job_storms = [i for i in aware if i.kind is IncidentKind.JOB_XID_STORM]
    assert job_storms and all(i.evidence["owner"] for i in job_storms)
    assert any(i.kind is IncidentKind.XID_STORM for i in aware)
    assert any(
        isinstance(r, JobEvent) and len({partition_of(n, 4) for n in r.nodes}) > 1
        for r in clusters["60 nodes x 20 days"]
    )


@pytest.mark.parametrize(("partitions", "seed"), [(2, 5), (4, 6), (8, 7)])
def test_short_history_lemon_verdicts_do_not_depend_on_partitions(
    clusters: dict[str, list[Record]], partitions: int, seed: int
) -> None:
    """Lemon verdicts from 2 days on, every 6 hours, each node against the fleet without its top
    nodes and scaled to its exposure: the same for any partitioning. (Its MTTF sums once
    differed: each partition's core accrued its running jobs up to its own last event, not the
    input's; ``DetectionCore.finish(end_ms)``.)"""
    records = clusters["32 nodes x 7 days"]
    one = embedded(records)
    many = partitioned(records, partitions, seed)
    assert many.incident_facts() == one.incident_facts()
    assert many.attributions == one.attributions
    assert many.mttf_sums() == one.mttf_sums()
    assert any(i.kind == IncidentKind.LEMON_NODE for i in one.incidents.values())


def test_a_week_of_history_is_enough_for_a_lemon_verdict(clusters: dict[str, list[Record]]) -> None:
    """The issue's case: 32 nodes, one week; the lemons (five or so hardware faults each) are
    found, and no other node."""
    records = clusters["32 nodes x 7 days"]
    core = DetectionCore(CoreConfig())  # the default lemon configuration
    out = Outcome.empty()
    for record in records:
        core.process(record)
        out.add(core.drain())
    out.add(core.finish())
    config = cell_config(cells_named(("lemon-many-32n-7d",))[0], seed=TUNING_SEEDS[0])
    from stream.simulator.history import run_model

    history = run_model(config)
    lemons = {config.node_names[n] for n in history.lemon_nodes}
    flagged = {i.node for i in out.incidents.values() if i.kind == IncidentKind.LEMON_NODE}
    assert flagged == lemons
    titles = [i.summary for i in out.incidents.values() if i.kind == IncidentKind.LEMON_NODE]
    assert all("confidence" in title for title in titles)


def test_a_lemon_is_judged_against_the_whole_fleet_not_its_partition() -> None:
    """A node with a few hardware faults among 40 quiet nodes is a lemon; with its verdict taken on
    the 10 nodes of its own partition (the old per-partition statistics) it would be judged
    against a different baseline. The stage sees all 40 whichever core reports them."""
    fleet = FleetCore(FleetConfig(lemon=LemonConfig(min_history_ms=DAY_MS, threshold=6.0)), partitions=4)
    for p in range(4):
        facts = [FleetFact(0, "seen", f"n{p}-{i}", cluster="c") for i in range(10)]
        fleet.add(p, facts)
    lemon = [FleetFact(day * DAY_MS + HOUR_MS, "signal", "n2-3", "hw_incidents") for day in range(4)]
    lemon += [FleetFact(day * DAY_MS + HOUR_MS, "failed_job", "n2-3", key=f"job{day}") for day in range(4)]
    fleet.add(2, lemon)
    for p in range(3):
        fleet.advance(p, 6 * DAY_MS)
    assert fleet.drain().incidents == []  # core 3 has not said it is past day 5
    fleet.advance(3, 6 * DAY_MS)
    incidents = fleet.drain().incidents  # opened, then updated at each daily verdict
    assert {(i.node, i.kind) for i in incidents} == {("n2-3", IncidentKind.LEMON_NODE)}
    assert len({i.incident_id for i in incidents}) == 1


def test_a_job_is_attributed_once_with_the_evidence_of_every_core() -> None:
    from detectors.attribution import HardwareEvent
    from schemas.records import JobState

    fleet = FleetCore(FleetConfig(), partitions=2)
    common = {"cluster": "c", "job_id": "7", "start_ms": 0, "end_ms": HOUR_MS, "state": JobState.FAILED,
              "nodes": ("a", "b"), "gpus": 16}  # fmt: skip
    fleet.add_job(JobPart(**common, covered=("a",), evidence=()))
    assert fleet.drain().attributions == []  # b's core has not decided yet
    evidence = HardwareEvent(HOUR_MS - 60_000, "b", "0000:07:00", IncidentKind.GPU_BUS, 79)
    fleet.add_job(JobPart(**common, covered=("b",), evidence=(evidence,)))
    fleet.add_job(JobPart(**common, covered=("b",), evidence=(evidence,)))  # a restarted core repeats it
    decided = fleet.drain()
    [attribution] = decided.attributions
    assert attribution.hardware and attribution.evidence_nodes == ("b",)
    assert [i.kind for i in decided.incidents] == [IncidentKind.JOB_HW_FAILURE]
    for window_seconds in (3600, 86400):  # one failure in each window length's rows
        assert sum(r.failures for r in decided.mttf if r.window_seconds == window_seconds) == 1


def test_the_storm_baseline_is_an_exact_quantile_of_peaks_two_periods_back() -> None:
    fleet = FleetCore(FleetConfig(baseline_period_ms=DAY_MS, baseline_min_gpus=1), partitions=1)
    peaks = [FleetFact(HOUR_MS * h, PEAK, value=v) for h, v in ((1, 10), (2, 30), (30, 99))]
    fleet.add(0, peaks)
    fleet.advance(0, 3 * DAY_MS + 1)
    assert fleet.baseline(DAY_MS) == 0.0
    assert fleet.baseline(2 * DAY_MS) == 30.0  # the peaks of day 0 only
    assert fleet.baseline(3 * DAY_MS) == 99.0
    assert exact_quantile([10, 30], 0.99) == 30.0


def test_a_burst_size_is_usual_only_when_many_gpus_reach_it() -> None:
    """In a quiet 64-node fleet (the tuning case of the matrix's 10-20 line storms): a hundred
    bursts of 1 or 2 XIDs, and four GPUs whose jobs' crashes logged 4 or 5. The 99th percentile is
    the second-largest burst, 4, and a storm would need 12 lines; no ten GPUs ever reached 3, so the
    usual burst is 2 and the floor of 10 decides."""
    facts = [FleetFact(HOUR_MS + n, PEAK, f"n{n % 60}", key=f"g{n % 8}", value=1 + n % 2) for n in range(100)]
    facts += [
        FleetFact(2 * HOUR_MS + n, PEAK, f"n{n}", key="g0", value=v) for n, v in enumerate((4, 5, 4, 4))
    ]
    quantile_only = FleetCore(FleetConfig(baseline_min_gpus=1), partitions=1)
    robust = FleetCore(FleetConfig(), partitions=1)
    for fleet in (quantile_only, robust):
        fleet.add(0, facts)
        fleet.advance(0, 3 * DAY_MS + 1)
    assert quantile_only.baseline(2 * DAY_MS) == 4.0
    assert robust.baseline(2 * DAY_MS) == 2.0
    # A fleet where every GPU's jobs log bursts of 30: that is usual, and stays the bar.
    busy = FleetCore(FleetConfig(), partitions=1)
    busy.add(0, [FleetFact(HOUR_MS + n, PEAK, f"n{n}", key="g0", value=30) for n in range(40)])
    busy.advance(0, 3 * DAY_MS + 1)
    assert busy.baseline(2 * DAY_MS) == 30.0


def sbe(ts_ms: int, node: str, errors: int, flagged: bool = False) -> FleetFact:
    return FleetFact(ts_ms, ECC_SBE, node, ECC_FLAGGED if flagged else "", "0000:07:00", errors, "c")


def test_the_ecc_reference_is_the_fleets_healthy_ceiling_from_the_errors_before_the_previous_hour() -> None:
    """Twelve GPUs corrected errors from 1:00 (the fleet's first error) on; at 13:00 their rates
    over those 12 hours make the reference of the period from 14:00; before, there is none (too
    little history), and after 13:00's errors, nothing changes until the next decision."""
    counts = [2, 3, 4, 4, 5, 6, 6, 8, 9, 12, 15, 200]  # one degrading GPU among them
    fleet = FleetCore(FleetConfig(), partitions=1)
    fleet.add(0, [sbe(HOUR_MS, f"n{k}", 1) for k in range(12)])
    fleet.add(0, [sbe(2 * HOUR_MS, f"n{k}", count - 1) for k, count in enumerate(counts)])
    fleet.add(0, [sbe(13 * HOUR_MS + 1, "n0", 1000)])  # after 13:00: in no reference before 15:00
    fleet.advance(0, 13 * HOUR_MS + 2)
    assert fleet.ecc_reference(HOUR_MS) == NO_ECC_REFERENCE
    assert fleet.ecc_reference(13 * HOUR_MS) == NO_ECC_REFERENCE  # 11 hours of errors: too few
    ceiling = healthy_ceiling(counts) * 2  # 12 hours: per day, twice the counts
    assert fleet.ecc_reference(14 * HOUR_MS) == pytest.approx(ceiling)
    assert 30.0 < ceiling < 100.0  # above the healthy GPUs' 2 to 30 a day, far below the 400
    assert fleet.ecc_reference(15 * HOUR_MS) is None  # not decided yet
    assert fleet.drain().ecc_references[14 * HOUR_MS] == pytest.approx(ceiling)


def test_a_gpu_flagged_as_degrading_is_no_peer_and_few_gpus_make_no_reference() -> None:
    def reference(facts: list[FleetFact]) -> float | None:
        fleet = FleetCore(FleetConfig(), partitions=1)
        fleet.add(0, facts)
        fleet.advance(0, DAY_MS + 1)
        return fleet.ecc_reference(DAY_MS)

    healthy = [sbe(0, f"n{k}", 4 + k) for k in range(10)]
    usual = reference(healthy)
    assert usual is not None and usual > 0
    assert reference(healthy[:9]) == NO_ECC_REFERENCE  # nine GPUs are no fleet
    # A degrading GPU flagged by its trend model is no peer: the ceiling is the healthy ten's.
    assert reference([*healthy, sbe(0, "bad", 5000, flagged=True)]) == usual
    assert reference([*healthy, sbe(0, "bad", 5000)]) != usual


def test_the_healthy_ceiling_is_robust_to_a_few_degrading_gpus() -> None:
    fleet = [3, 4, 4, 5, 6, 7, 8, 9, 10, 12, 14, 20, 25]
    ceiling = healthy_ceiling(fleet)
    assert ceiling > max(fleet[:-1])
    assert healthy_ceiling([*fleet, 900, 1500]) < 2 * ceiling  # two GPUs far out move it little
