"""The event-driven cluster: a FIFO scheduler with EASY backfill, and the faults that interrupt it.

Jobs arrive as a Poisson process (:mod:`stream.simulator.history` draws them from the workload of
:mod:`stream.simulator.workload`). A job takes whole nodes (``ceil(gpus / gpus_per_node)``; a 1 to
7 GPU job has a node to itself), so its exposure is nodes x run time. The scheduler is FIFO with
EASY backfill: the blocked head of the queue holds a reservation (its *shadow time*), and later
jobs may start if they end before it or use only nodes it does not need. Jobs go to the
lowest-numbered free healthy nodes.

A critical fault (:class:`stream.simulator.faults.FaultPlan`) on a busy node kills its job 0.5 to
4 minutes later (FAILED or NODE_FAIL), and its user resubmits the rest of the work (a new job id,
as restarting from a checkpoint); the node is down for a repair of 2 to 24 hours. A fault on an
idle node takes it out of service; no job dies. A fault within
:data:`~stream.simulator.faults.FAULT_QUIET_AFTER_END_MS` after a job ended on its node is
postponed. An XID storm (:mod:`stream.simulator.planted.storms`) happens only on a node running a
job, and may kill it (for user reasons).

Determinism: events are handled in time order, ties broken by event kind and a sequence number;
nothing iterates over a set or reads a clock.
"""

from __future__ import annotations

import bisect
import heapq
from typing import Final

import numpy as np

from schemas.records import JobState
from schemas.timeutil import HOUR_MS, MINUTE_MS
from stream.simulator.config import SECOND_MS, SimulationConfig
from stream.simulator.faults import (
    FAULT_KIND_CRITICAL_HW,
    FAULT_QUIET_AFTER_END_MS,
    FAULT_SOURCE_ECC_DEGRADATION,
    FAULT_SOURCE_LEMON,
    FAULT_SOURCE_TRACE,
    FAULT_TEMPLATES_BY_NAME,
    HARDWARE_FAULT_TEMPLATES,
    LEMON_FAULT_TEMPLATES,
    FaultPlan,
    FaultRecord,
)
from stream.simulator.planted.storms import StormDraw, StormRecord, storm_window
from stream.simulator.workload import (
    ADMIN_UID,
    FAILED_EXIT_CODES,
    FIRST_UID,
    JOB_ID_BASE,
    JOB_NAMES,
    OUTCOME_STATES,
    PROCESS_NAMES,
    Demand,
    JobOutcome,
    JobRecord,
)

__all__ = ["Cluster"]

# States of a node.
_FREE, _BUSY, _DOWN = 0, 1, 2
# Event kinds, in the order they are handled at the same millisecond.
_EV_REPAIR, _EV_END, _EV_FAULT, _EV_ARRIVAL, _EV_STORM = 0, 1, 2, 3, 4
# Far beyond any simulated time: "no reservation", "no job ended yet".
_NEVER: Final = 1 << 62


def _ceil_second(ts_ms: int) -> int:
    """Round up to a whole second: sacct prints seconds, so job and repair times are whole."""
    return -(-ts_ms // SECOND_MS) * SECOND_MS


class Cluster:
    """State of the event-driven simulation: nodes, queue, running jobs, events.

    Parameters
    ----------
    config
        The cluster, span and model knobs.
    demand
        Attributes of the submitted jobs, by internal job number.
    submit_ms
        Arrival time of each submitted job (whole seconds, ascending).
    rng
        Draws the faults' templates, GPUs, kill delays, repairs and resubmissions.
    fault_plans
        The critical faults to strike, each at its onset.
    protected
        Per node with a degrading GPU, the window where no other critical fault strikes it.
    storm_draws
        The XID storms to try, in time order.
    pins
        Users whose every (single-node) job runs on one node: user number -> node. Their jobs
        wait for that node and start on it as soon as it is free, before the queue.

    Every arrival, planned fault and storm is queued at construction; :meth:`run` plays them.
    """

    def __init__(
        self,
        config: SimulationConfig,
        demand: Demand,
        submit_ms: list[int],
        rng: np.random.Generator,
        fault_plans: list[FaultPlan],
        protected: dict[int, tuple[int, int]],
        storm_draws: tuple[StormDraw, ...],
        pins: dict[int, int] | None = None,
    ) -> None:
        self.config = config
        self.rng = rng
        # Payloads of the fault events; base faults on a node in its protected window (around a
        # degradation, whose SBE counter must not be reset by a reboot) are dropped.
        self.fault_plans = fault_plans
        self.protected = protected
        self.storm_draws = storm_draws
        self.storms: list[StormRecord] = []
        self.degradation_fault: dict[int, int] = {}  # DegradationPlan.index -> fault index
        self.natural_outcome: dict[int, int] = {}  # outcome of a job before a storm doomed it
        # Job attributes, by internal job number (arrival order of the demand, then resubmissions).
        self.submit = list(submit_ms)
        self.nnodes: list[int] = demand.nnodes.tolist()
        self.gpus: list[int] = demand.gpus.tolist()
        self.runtime: list[int] = demand.runtime_ms.tolist()
        self.outcome: list[int] = demand.outcome.tolist()
        self.user: list[int] = demand.user.tolist()
        self.name: list[int] = demand.name.tolist()
        self.process: list[int] = demand.process.tolist()
        self.exit_code: list[int] = demand.exit_code.tolist()
        self.cancel_kind: list[float] = demand.cancel_kind.tolist()
        self.resubmit_of: list[int] = [-1] * len(self.submit)
        self.job_id: list[int] = [-1] * len(self.submit)  # given at submission, in submit order
        self.next_job_id = JOB_ID_BASE
        jobs = len(self.nnodes)
        nodes = config.nodes
        self.state = [_FREE] * nodes
        self.node_job = [-1] * nodes
        self.last_end = [-_NEVER] * nodes
        self.free_heap = list(range(nodes))
        self.free_count = nodes
        self.queue: list[int] = []
        self.pins = dict(pins or {})
        self.pinned: dict[int, list[int]] = {node: [] for node in sorted(set(self.pins.values()))}
        self.running: list[tuple[int, int]] = []  # (end_ms, job), sorted
        self.events: list[tuple[int, int, int, int]] = []  # (ts_ms, kind, seq, payload)
        self.seq = 0
        self.start = [-1] * jobs
        self.end = [-1] * jobs
        self.done = [False] * jobs
        self.killed_by = [-1] * jobs
        self.killed_at = [-1] * jobs
        self.resubmit_draws: list[tuple[float, float]] = [(1.0, 0.0)] * jobs
        self.storm_of = [-1] * jobs  # storm on the job (at most one)
        self.kill_state: dict[int, JobState] = {}
        self.job_nodes: list[tuple[int, ...]] = [()] * jobs
        self.faults: list[FaultRecord] = []
        self.shadow_head = -1
        self.shadow_time = 0
        self.shadow_extra = 0
        self.shadow_dirty = True
        weights = np.array([template.weight for template in HARDWARE_FAULT_TEMPLATES])
        self.template_cdf = np.cumsum(weights / weights.sum())
        lemon_weights = np.array([template.weight for template in LEMON_FAULT_TEMPLATES])
        self.lemon_cdf = np.cumsum(lemon_weights / lemon_weights.sum())
        # Queued in this order, so that the sequence numbers that break ties between events of
        # the same millisecond and kind follow it.
        for job, ts_ms in enumerate(self.submit):
            self.push(ts_ms, _EV_ARRIVAL, job)
        for planned, plan in enumerate(self.fault_plans):
            self.push(plan.onset_ms, _EV_FAULT, planned)
        for index, draw in enumerate(self.storm_draws):
            self.push(draw.ts_ms, _EV_STORM, index)

    def push(self, ts_ms: int, kind: int, payload: int) -> None:
        """Schedule an event."""
        self.seq += 1
        heapq.heappush(self.events, (ts_ms, kind, self.seq, payload))

    def run(self, end_ms: int) -> None:
        """Handle events in time order up to and including ``end_ms``."""
        handlers = {
            _EV_REPAIR: self.on_repair,
            _EV_END: self.on_end,
            _EV_FAULT: self.on_fault,
            _EV_ARRIVAL: self.on_arrival,
            _EV_STORM: self.on_storm,
        }
        while self.events and self.events[0][0] <= end_ms:
            ts_ms, kind, _, payload = heapq.heappop(self.events)
            handlers[kind](ts_ms, payload)

    # -- events --------------------------------------------------------------------------------

    def on_arrival(self, now: int, job: int) -> None:
        """A job is submitted: it gets the next job id and joins the queue."""
        self.job_id[job] = self.next_job_id
        self.next_job_id += 1
        pinned = self.pins.get(self.user[job])
        if pinned is not None and self.nnodes[job] == 1:
            self.pinned[pinned].append(job)
        else:
            self.queue.append(job)
        self.schedule(now)

    def resubmit(self, job: int, now: int, delay_draw: float) -> None:
        """Submit the rest of a killed job's work as a new job (it restarts from a checkpoint)."""
        config = self.config
        delay_s = 60.0 + delay_draw * (config.resubmit_delay_max_s - 60.0)
        submit = _ceil_second(now + round(delay_s * SECOND_MS))
        if submit >= config.end_ms:
            return
        remaining = self.start[job] + self.runtime[job] - self.killed_at[job]
        new = len(self.submit)
        self.submit.append(submit)
        copied = (self.nnodes, self.gpus, self.outcome, self.user, self.name, self.process, self.exit_code)
        for attribute in copied:
            attribute.append(attribute[job])
        self.outcome[new] = self.natural_outcome.get(job, self.outcome[new])
        self.cancel_kind.append(self.cancel_kind[job])
        self.runtime.append(max(remaining // SECOND_MS * SECOND_MS, MINUTE_MS))  # whole seconds
        self.resubmit_of.append(job)
        self.job_id.append(-1)
        self.start.append(-1)
        self.end.append(-1)
        self.done.append(False)
        self.killed_by.append(-1)
        self.killed_at.append(-1)
        self.resubmit_draws.append((1.0, 0.0))
        self.storm_of.append(-1)
        self.job_nodes.append(())
        self.push(submit, _EV_ARRIVAL, new)

    def on_end(self, now: int, job: int) -> None:
        """A job ends: its nodes free up (unless down), and a killed job may be resubmitted."""
        if self.done[job] or self.end[job] != now:
            return  # stale: the job was killed and ends at another time
        self.done[job] = True
        del self.running[bisect.bisect_left(self.running, (now, job))]
        for node in self.job_nodes[job]:
            self.node_job[node] = -1
            self.last_end[node] = now
            if self.state[node] == _BUSY:
                self.state[node] = _FREE
                heapq.heappush(self.free_heap, node)
                self.free_count += 1
        if self.killed_by[job] >= 0:
            resubmit, delay = self.resubmit_draws[job]
            if resubmit < self.config.resubmit_probability:
                self.resubmit(job, now, delay)
        self.schedule(now)

    def on_repair(self, now: int, node: int) -> None:
        """A node comes back from its repair (it rebooted) and is free again."""
        self.state[node] = _FREE
        heapq.heappush(self.free_heap, node)
        self.free_count += 1
        self.shadow_dirty = True
        self.schedule(now)

    def on_fault(self, now: int, planned: int) -> None:
        """A planned critical fault strikes its node: the node goes down, its job (if any) dies.

        The fault is moot on a node already down, dropped within a degrading GPU's protected
        window (unless it is that GPU's failure, or a trace's fault), and postponed just after a
        job's end. A planned repair time (a trace's fault end) replaces the drawn one.
        """
        config = self.config
        plan = self.fault_plans[planned]
        node = plan.node
        if self.state[node] == _DOWN:
            return  # the node is already out for repair: the fault is moot
        window = self.protected.get(node, (_NEVER, _NEVER))
        exempt = plan.source in (FAULT_SOURCE_ECC_DEGRADATION, FAULT_SOURCE_TRACE)
        if not exempt and window[0] <= now <= window[1]:
            return  # the node's degrading GPU is the fault planted there
        if now - self.last_end[node] < FAULT_QUIET_AFTER_END_MS:
            later = now + FAULT_QUIET_AFTER_END_MS
            if later < config.end_ms:
                self.push(later, _EV_FAULT, planned)
            return
        rng = self.rng
        draws = rng.random(8)  # template, gpu, kill delay, NODE_FAIL, repair, replacement, resubmission
        lemon = plan.source == FAULT_SOURCE_LEMON
        if plan.template:
            template = FAULT_TEMPLATES_BY_NAME[plan.template]
        elif lemon:
            template = LEMON_FAULT_TEMPLATES[int(np.searchsorted(self.lemon_cdf, draws[0], side="right"))]
        else:
            drawn = int(np.searchsorted(self.template_cdf, draws[0], side="right"))
            template = HARDWARE_FAULT_TEMPLATES[drawn]
        job = self.node_job[node]
        gpu_choices = -(-self.gpus[job] // self.nnodes[job]) if job >= 0 else config.gpus_per_node
        gpu = plan.gpu if plan.gpu >= 0 else min(int(draws[1] * gpu_choices), gpu_choices - 1)
        index = len(self.faults)
        killed = job >= 0 and self.killed_by[job] < 0
        if killed:
            delay = config.kill_delay_min_s + draws[2] * (config.kill_delay_max_s - config.kill_delay_min_s)
            new_end = _ceil_second(now + round(delay * SECOND_MS))
            del self.running[bisect.bisect_left(self.running, (self.end[job], job))]
            self.end[job] = new_end
            bisect.insort(self.running, (new_end, job))
            self.push(new_end, _EV_END, job)
            self.killed_by[job] = index
            self.killed_at[job] = now
            self.resubmit_draws[job] = (float(draws[6]), float(draws[7]))
            node_fail = draws[3] < (config.lemon_node_fail_fraction if lemon else config.node_fail_fraction)
            self.kill_state[job] = JobState.NODE_FAIL if node_fail else JobState.FAILED
        if job < 0:
            self.free_count -= 1  # it stays in the free heap: skipped when popped
        self.state[node] = _DOWN
        hours = config.repair_min_hours + draws[4] * (config.repair_max_hours - config.repair_min_hours)
        repaired = _ceil_second(now + round(hours * HOUR_MS))
        if plan.repair_ms >= 0:  # not before the killed job ended (at most 300 s after the strike)
            repaired = _ceil_second(max(plan.repair_ms, now + FAULT_QUIET_AFTER_END_MS))
        self.push(repaired, _EV_REPAIR, node)
        self.faults.append(
            FaultRecord(
                index=index,
                kind=FAULT_KIND_CRITICAL_HW,
                template=template.name,
                node=node,
                gpu=gpu,
                xids=template.xids,
                onset_ms=now,
                job_index=job if job >= 0 else None,
                killed_job=killed,
                repaired_ms=repaired,
                gpu_replaced=bool(template.remap_failure and draws[5] < config.gpu_replace_probability),
                source=plan.source,
                degradation=plan.degradation if plan.degradation >= 0 else None,
                trace=plan.trace if plan.trace >= 0 else None,
            )
        )
        if plan.degradation >= 0:
            self.degradation_fault[plan.degradation] = index
        self.shadow_dirty = True

    def on_storm(self, now: int, index: int) -> None:
        """An XID storm on a GPU of the job running on the node (none on an idle node)."""
        draw = self.storm_draws[index]
        node = draw.node
        job = self.node_job[node]
        if job < 0 or self.state[node] != _BUSY or self.killed_by[job] >= 0 or self.storm_of[job] >= 0:
            return
        last = storm_window(draw, now, self.end[job])
        if last is None:
            return
        config = self.config
        used = -(-self.gpus[job] // self.nnodes[job])
        gpu = min(int(draw.gpu_draw * used), used - 1)
        if draw.kill:
            # The job dies of its own errors shortly after the last line: FAILED, for user reasons.
            spread = config.kill_delay_max_s - config.kill_delay_min_s
            delay = config.kill_delay_min_s + draw.delay_draw * spread
            new_end = _ceil_second(last + round(delay * SECOND_MS))
            del self.running[bisect.bisect_left(self.running, (self.end[job], job))]
            self.end[job] = new_end
            bisect.insort(self.running, (new_end, job))
            self.push(new_end, _EV_END, job)
            self.natural_outcome[job] = self.outcome[job]
            self.outcome[job] = JobOutcome.FAILED
            self.shadow_dirty = True
        self.storm_of[job] = len(self.storms)
        self.storms.append(
            StormRecord(
                len(self.storms), node, gpu, draw.xid, draw.lines, job, now, last, draw.kill, draw.gpu_fault
            )
        )

    # -- scheduling ----------------------------------------------------------------------------

    def start_job(self, job: int, now: int) -> None:
        """Start a job on the lowest-numbered free nodes (the caller checked there are enough)."""
        taken: list[int] = []
        need = self.nnodes[job]
        while len(taken) < need:
            node = heapq.heappop(self.free_heap)
            if self.state[node] != _FREE:
                continue  # stale heap entry (the node went down, or was pushed twice)
            self.state[node] = _BUSY
            self.node_job[node] = job
            taken.append(node)
        self.free_count -= need
        taken.sort()
        self.job_nodes[job] = tuple(taken)
        self.start[job] = now
        end = now + self.runtime[job]
        self.end[job] = end
        bisect.insort(self.running, (end, job))
        self.push(end, _EV_END, job)

    def start_pinned(self, now: int) -> None:
        """Start the jobs waiting for their pinned node on it, where it is free (oldest first)."""
        for node, waiting in self.pinned.items():
            if not waiting or self.state[node] != _FREE:
                continue
            job = waiting.pop(0)
            self.state[node] = _BUSY  # its free-heap entry is stale now: skipped when popped
            self.node_job[node] = job
            self.free_count -= 1
            self.job_nodes[job] = (node,)
            self.start[job] = now
            end = now + self.runtime[job]
            self.end[job] = end
            bisect.insort(self.running, (end, job))
            self.push(end, _EV_END, job)
            self.shadow_dirty = True

    def compute_shadow(self, head: int) -> None:
        """Reservation of the blocked head: when enough nodes free up, and how many spare."""
        need = self.nnodes[head] - self.free_count
        freed = 0
        self.shadow_time, self.shadow_extra = _NEVER, 0
        for end, job in self.running:
            freed += sum(1 for node in self.job_nodes[job] if self.state[node] == _BUSY)
            if freed >= need:
                self.shadow_time, self.shadow_extra = end, freed - need
                break
        self.shadow_head = head
        self.shadow_dirty = False

    def schedule(self, now: int) -> None:
        """Start the jobs waiting for a pinned node that is free, then the queue's head jobs while
        they fit, then backfill behind the blocked head."""
        if self.pinned:
            self.start_pinned(now)
        queue = self.queue
        started = 0
        while started < len(queue) and self.nnodes[queue[started]] <= self.free_count:
            self.start_job(queue[started], now)
            started += 1
        if started:
            del queue[:started]
        if not queue or self.free_count == 0 or self.config.backfill_depth == 0:
            return
        head = queue[0]
        if self.shadow_dirty or self.shadow_head != head:
            self.compute_shadow(head)
        picked: list[int] = []
        for position in range(1, min(len(queue), self.config.backfill_depth + 1)):
            job = queue[position]
            size = self.nnodes[job]
            if size > self.free_count:
                continue
            before_shadow = now + self.runtime[job] <= self.shadow_time
            if before_shadow or size <= self.shadow_extra:
                self.start_job(job, now)
                picked.append(position)
                if not before_shadow:
                    self.shadow_extra -= size
                if self.free_count == 0:
                    break
        for position in reversed(picked):
            del queue[position]

    # -- results -------------------------------------------------------------------------------

    def job_records(self) -> tuple[JobRecord, ...]:
        """Records of the jobs that started, in submit (= job id) order."""
        records: list[JobRecord] = []
        for job, started in enumerate(self.start):
            if started < 0:
                continue
            uid = FIRST_UID + self.user[job]
            cancelled_by: int | None = None
            end: int | None = self.end[job] if self.done[job] else None
            fault = self.killed_by[job]
            failed_exit = FAILED_EXIT_CODES[self.exit_code[job]][0]
            if end is None:
                state, exit_code = JobState.RUNNING, "0:0"
            elif fault >= 0:
                state = self.kill_state[job]
                exit_code = failed_exit if state is JobState.FAILED else "0:0"
            else:
                state = OUTCOME_STATES[self.outcome[job]]
                exit_code = {JobState.FAILED: failed_exit, JobState.OUT_OF_MEMORY: "0:125"}.get(state, "0:0")
                cancel_kind = self.cancel_kind[job]
                if state is JobState.CANCELLED and cancel_kind < 0.85:
                    cancelled_by = ADMIN_UID if cancel_kind < 0.10 else uid
            previous = self.resubmit_of[job]
            storm = self.storm_of[job]
            storm_killed = storm >= 0 and fault < 0 and end is not None and self.storms[storm].killed_job
            records.append(
                JobRecord(
                    index=job,
                    job_id=str(self.job_id[job]),
                    name=JOB_NAMES[self.name[job]],
                    user=f"user{self.user[job] + 1:03d}",
                    uid=uid,
                    submit_ms=self.submit[job],
                    start_ms=started,
                    end_ms=end,
                    state=state,
                    cancelled_by=cancelled_by,
                    exit_code=exit_code,
                    nodes=self.job_nodes[job],
                    gpus=self.gpus[job],
                    process=PROCESS_NAMES[self.process[job]],
                    fault_index=fault if fault >= 0 else None,
                    resubmit_of=str(self.job_id[previous]) if previous >= 0 else None,
                    storm_index=storm if storm_killed else None,
                )
            )
        records.sort(key=lambda record: int(record.job_id))
        return tuple(records)
