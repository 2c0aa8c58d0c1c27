"""Flapping NVLinks: bursts of non-fatal NVLink XIDs from a node for hours.

``nvlink_flapping``
    Bursts of 3 to 20 non-fatal NVLink XIDs (144) every 15 to 120 minutes for 6 to 48 hours,
    spreading from one GPU of the node to others. No job dies of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from schemas.timeutil import HOUR_MS, MINUTE_MS
from stream.simulator.config import SimulationConfig
from stream.simulator.events import XidRecord, line_us

__all__ = ["FAULT_KIND_NVLINK_FLAPPING", "FLAP_MIN_GAP_MS", "NVLINK_FLAP_XID", "FlapRecord", "plan_flapping"]

FAULT_KIND_NVLINK_FLAPPING: Final = "nvlink_flapping"

#: "NVLink: SAW MVB non-fatal error": the XID of a flapping link (warn, never fatal).
NVLINK_FLAP_XID: Final = 144

# Flapping: span of the episode, GPUs involved, lines per burst, gap between bursts.
_FLAP_HOURS: Final = (6.0, 48.0)
_FLAP_MAX_GPUS: Final = 5
_FLAP_BURST_LINES: Final = (3, 20)
_FLAP_GAP_MINUTES: Final = (15, 120)
#: The shortest gap between two bursts of a flapping link: an episode whose lines span less logged
#: one burst only (it began minutes before the span's end), not yet a recurrence.
FLAP_MIN_GAP_MS: Final = _FLAP_GAP_MINUTES[0] * MINUTE_MS


@dataclass(frozen=True, slots=True)
class FlapRecord:
    """A flapping NVLink: ``gpus`` in the order they started logging, first and last line."""

    index: int
    node: int
    gpus: tuple[int, ...]
    onset_ms: int
    end_ms: int
    lines: int


def plan_flapping(
    config: SimulationConfig, rng: np.random.Generator
) -> tuple[tuple[FlapRecord, ...], list[XidRecord]]:
    """Plan flapping NVLinks (``nvlink_flapping_rate`` per 1000 node-days) and their XID lines.

    Returns
    -------
    tuple[tuple[FlapRecord, ...], list[XidRecord]]
        The episodes (onset order) and their XID 144 lines (pid unknown: the driver logs them).
    """
    count = int(rng.poisson(config.nvlink_flapping_rate / 1000.0 * config.nodes * config.days))
    starts = np.sort(rng.integers(config.start_ms, config.end_ms, size=count))
    nodes = rng.integers(0, config.nodes, size=count)
    gpn = config.gpus_per_node
    episodes: list[tuple[int, int, tuple[int, ...], list[XidRecord]]] = []
    for start, node in zip(starts.tolist(), nodes.tolist(), strict=True):
        length = round(rng.uniform(*_FLAP_HOURS) * HOUR_MS)
        involved = int(rng.integers(2, min(gpn, _FLAP_MAX_GPUS) + 1)) if gpn > 1 else 1
        order = [int(gpu) for gpu in rng.permutation(gpn)[:involved]]
        joins = [start, *sorted(rng.integers(start + 1, start + 3 * length // 4, involved - 1).tolist())]
        lines: list[XidRecord] = []
        burst = start
        while burst <= start + length and burst < config.end_ms:
            active = [gpu for gpu, joined in zip(order, joins, strict=True) if joined <= burst]
            ts_ms = burst
            for line in range(int(rng.integers(_FLAP_BURST_LINES[0], _FLAP_BURST_LINES[1] + 1))):
                if line:
                    ts_ms += int(rng.integers(50, 3_000))
                gpu = active[int(rng.integers(0, len(active)))]
                if ts_ms >= config.end_ms:
                    break
                lines.append(XidRecord(line_us(ts_ms, rng), node, gpu, NVLINK_FLAP_XID, None, ""))
            burst = ts_ms + int(rng.integers(_FLAP_GAP_MINUTES[0], _FLAP_GAP_MINUTES[1] + 1)) * MINUTE_MS
        seen: list[int] = []
        for record in lines:
            if record.gpu not in seen:
                seen.append(record.gpu)
        episodes.append((start, node, tuple(seen), lines))
    records: list[FlapRecord] = []
    xids: list[XidRecord] = []
    for index, (start, node, gpus, lines) in enumerate(episodes):
        records.append(FlapRecord(index, node, gpus, start, lines[-1].ts_us // 1000, len(lines)))
        xids.extend(lines)
    return tuple(records), xids
