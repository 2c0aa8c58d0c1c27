"""What the worker knows of Faust's and aiokafka's fetchers: the stall safety net and its diagnostics.

Everything here reads or touches private attributes of the two libraries (there is no public
view of a partition's fetch state), so it is kept in this one module and is best effort: an
attribute that moved in a new release makes a diagnostic say "unavailable", never a crash.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

__all__ = ["committed_offsets", "fetch_state", "refetch"]


def committed_offsets(consumer: Any) -> dict[Any, int]:
    """Faust's record of each partition's committed offset (it keeps no public one)."""
    committed: dict[Any, int] = getattr(consumer, "_committed_offset", {})
    return committed


def refetch(app: Any, tp: Any) -> None:
    """Put a stalled partition back on Faust's fetch list. Faust drops it while the agent's
    queue is under pressure and relies on a callback to put it back when the queue drains;
    a lost callback was suspected before the stalls were traced to the broker's retention
    (every stall seen showed the partition active), so this is a cheap safety net only."""
    consumer = app.consumer
    if app.rebalancing or tp in consumer._paused_partitions:
        return  # paused on purpose (a rebalance or recovery): Faust resumes it
    consumer._buffered_partitions.discard(tp)
    active = consumer._active_partitions
    if active is not None:
        active.add(tp)


def fetch_state(app: Any, tp: Any) -> str:
    """Where Faust's and aiokafka's fetchers stand on a partition, for the stall warning."""
    consumer = app.consumer
    try:
        faust_state = (
            f"faust: active={tp in (consumer._active_partitions or ())} "
            f"buffered={tp in consumer._buffered_partitions} paused={tp in consumer._paused_partitions} "
            f"flow={consumer.flow_active} read_offset={consumer._read_offset.get(tp)}"
        )
        kafka = consumer._thread._consumer
        assignment = kafka._subscription.subscription.assignment
        ktp = next(t for t in assignment.tps if t.topic == tp.topic and t.partition == tp.partition)
        state = assignment.state_value(ktp)
        cached = kafka._fetcher._records.get(ktp)
        held = getattr(consumer._thread, "fair_poll", None)
        waiting = held.waiting.get(ktp) if held is not None else None
        return (
            f"{faust_state}; aiokafka: position={state._position} paused={state.paused} "
            f"cached={type(cached).__name__ if cached is not None else None}; "
            f"held for the next polls: {len(waiting.records) if waiting is not None else 0}; "
            f"fetcher awaits: {_fetcher_awaits(getattr(consumer._thread, 'thread_loop', None))}"
        )
    except Exception as exc:  # private attributes of two libraries: best effort only
        return f"fetch state unavailable: {exc!r}"


def _await_chain(coro: Any) -> str:
    """A suspended coroutine's chain of awaits, innermost last."""
    chain: list[str] = []
    awaited: Any = coro
    frame: Any = None
    while awaited is not None and len(chain) < 25:
        if type(awaited).__name__ == "async_generator_asend" and frame is not None:
            # The awaited generator is only reachable from the awaiting frame's locals.
            awaited = next((v for v in frame.f_locals.values() if inspect.isasyncgen(v)), None)
            continue
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
        if frame is not None:
            chain.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
        else:
            chain.append(repr(awaited)[:160])
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
    return " > ".join(chain)


def _fetcher_awaits(thread_loop: Any = None) -> str:
    """Where Faust's fetcher task is suspended, and the consumer thread's fetch call."""
    found = [
        _await_chain(task.get_coro())
        for task in asyncio.all_tasks()
        if "Fetcher._fetcher" in task.get_name() + repr(task.get_coro())
    ]
    if thread_loop is not None:
        found += [
            "thread: " + chain
            for task in asyncio.all_tasks(thread_loop)
            if "fetch" in (chain := _await_chain(task.get_coro()))
        ]
    return " | ".join(found) or "no fetcher task"
