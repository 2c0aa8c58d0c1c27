"""dcgm-exporter's XID gauge for a simulated cluster: what ``DCGM_FI_DEV_XID_ERRORS`` would have
shown at each scrape, given the XIDs its kernel log holds.

The gauge (DCGM field 230) holds the last XID code a GPU reported, scrape after scrape; a cluster
that ships its kernel log and remote_writes its exporters' series reports each XID twice: as the
kernel line, and as the gauge's change at the next scrape (later: the scrape's time). The file
written here is that second report, a scrape block per scrape time with one line per GPU, beside
the simulator's own ``dcgm.prom`` (which has no gauge).
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from schemas.records import XidEvent
from stream.inputs.parsers.kernel_log import parse_kernel_log
from stream.inputs.parsers.options import ParseOptions

__all__ = ["gauge_reports", "write_xid_gauge"]

_SERIES_RE = re.compile(rb"^DCGM_FI_DEV_ECC_SBE_VOL_TOTAL\{(?P<labels>[^}]*)\} \S+ (?P<ts>\d+)$")
_LABEL_RE = re.compile(r'(\w+)="([^"]*)"')


def _series(dcgm: Path) -> tuple[list[int], dict[tuple[str, str], str]]:
    """The scrape times of a simulated ``dcgm.prom``, and each GPU's (node, PCI id) -> labels."""
    times: set[int] = set()
    labels: dict[tuple[str, str], str] = {}
    with dcgm.open("rb") as handle:
        for line in handle:
            match = _SERIES_RE.match(line.rstrip(b"\n"))
            if match is None:
                continue
            times.add(int(match["ts"]))
            text = match["labels"].decode()
            found = dict(_LABEL_RE.findall(text))
            bus = found["pci_bus_id"].lower()  # 00000000:3b:00.0 -> the kernel's 0000:3b:00
            labels.setdefault((found["Hostname"], f"{bus[4:8]}:{bus[9:11]}:{bus[12:14]}"), text)
    return sorted(times), labels


def write_xid_gauge(sim: Path, path: Path, skip: frozenset[tuple[str, int]] = frozenset()) -> list[XidEvent]:
    """Write the gauge of ``sim``'s GPUs at each scrape of its ``dcgm.prom`` to ``path``.

    ``skip`` leaves out of the gauge the XIDs of these ``(node, ts_ms)``. Returns the kernel's GPU
    XIDs the gauge was made from, in time order.
    """
    times, labels = _series(sim / "dcgm.prom")
    kernel = [
        item
        for item in parse_kernel_log((sim / "kernel.log").open("rb"), ParseOptions(), str(sim / "kernel.log"))
        if isinstance(item, XidEvent) and item.device == "gpu" and item.pci_bus_id
    ]
    kernel.sort(key=lambda event: event.ts_ms)
    last: dict[tuple[str, str], int] = defaultdict(int)
    position = 0
    with path.open("w") as out:
        out.write("# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.\n")
        for ts in times:
            while position < len(kernel) and kernel[position].ts_ms <= ts:
                event = kernel[position]
                if (event.node, event.ts_ms) not in skip:
                    last[(event.node, event.pci_bus_id)] = event.xid
                position += 1
            out.write("# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n")
            for key, text in sorted(labels.items()):
                out.write(f"DCGM_FI_DEV_XID_ERRORS{{{text}}} {last[key]} {ts}\n")
    return kernel


def gauge_reports(path: Path) -> list[XidEvent]:
    """The XID reports the replay reads from a gauge file (a change of a GPU's value)."""
    from stream.inputs.parsers.dcgm import parse_dcgm

    return [
        item for item in parse_dcgm(path.open("rb"), ParseOptions(), str(path)) if isinstance(item, XidEvent)
    ]
