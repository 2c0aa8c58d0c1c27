"""Write a simulated history in the formats real clusters produce.

* ``kernel.log``: ``journalctl -k -o short-iso`` lines of every node, merged in time order as a
  central log collector delivers them (``NVRM: Xid`` lines among benign kernel messages).
* ``sacct.txt``: ``sacct -P`` output of the jobs in submit order, each job line followed by its
  ``.batch`` and ``.extern`` steps.
* ``dcgm.prom``: DCGM exporter scrapes in the Prometheus text format, one block per scrape.

The writers only format: every random choice was made by :mod:`stream.simulator.history`, so the
same history always gives the same bytes.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

from schemas.records import JobState
from stream.simulator.config import pci_bus_id
from stream.simulator.ecc import iter_ecc_scrapes
from stream.simulator.events import KernelLine, KernelLineKind, XidRecord
from stream.simulator.history import ClusterHistory
from stream.simulator.workload import JobRecord

__all__ = [
    "DCGM_METRICS",
    "SACCT_HEADER",
    "XID_MESSAGES",
    "gpu_uuid",
    "write_dcgm",
    "write_kernel_log",
    "write_sacct",
]

#: Message text after ``pid=..., name=...,`` for each XID code the model emits (NVIDIA's texts).
XID_MESSAGES: Final[dict[int, str]] = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
    31: (
        "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_3c000000. "
        "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"
    ),
    43: "Ch 00000010, intr 10000000",
    45: "Ch 00000018, errorString CTX SWITCH TIMEOUT",
    48: (
        "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
        "at partition 6, subpartition 0."
    ),
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    62: "Internal micro-controller halt (PMU halt): 0x0000_2c1f 0x00000000 0x00000000",
    64: "Row Remapper: Failed to remap row.",
    68: "NVDEC0 Exception: Error Interrupt",
    74: "NVLink: fatal error detected on link 5(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: LTC TAG (0x2,0x0). RST: Yes, D-RST: No",
    109: "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
    119: (
        "Timeout after 6s of waiting for RPC response from GPU0 GSP! "
        "Expected function 76 (GSP_RM_CONTROL) (0x2080014b 0x5)."
    ),
    120: "GSP task timeout @ pc:0x17d0e90, task: 1",
    144: "NVLink: SAW MVB non-fatal error, Link 03 (0x00000000 0x00000000 0x00000000 0x00000000)",
}

# Benign kernel messages; ``{a}``..``{d}`` are filled from a line's variant number.
_NOISE_TEMPLATES: Final[tuple[str, ...]] = (
    "mlx5_core 0000:0c:00.0: mlx5_pcie_event:301:(pid {a}): PCIe slot advertised sufficient power (75W).",
    "mlx5_core 0000:0c:00.0 ibp12s0: Link up",
    "mlx5_core 0000:8d:00.0: Port module event: module {b}, Cable plugged",
    "EXT4-fs (nvme0n1p2): re-mounted. Opts: errors=remount-ro. Quota mode: none.",
    "EXT4-fs (md0): mounted filesystem with ordered data mode. Opts: (null). Quota mode: none.",
    "perf: interrupt took too long ({c} > {d}), lowering kernel.perf_event_max_sample_rate to 79750",
    "IPv6: ADDRCONF(NETDEV_CHANGE): ib{b}: link becomes ready",
    "docker0: port {b}(veth{e}) entered forwarding state",
    "nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping further processing",
    "TCP: request_sock_TCP: Possible SYN flooding on port 6818. Sending cookies.  Check SNMP counters.",
    'audit: type=1400 audit({f}): apparmor="DENIED" operation="open" profile="snap-update-ns" pid={a}',
    "nfs: server storage{b} OK",
)
_BOOT_DRIVER: Final = (
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023"
)
_BOOT_NVLINK: Final = "nvidia-nvlink: Nvlink Core is being initialized, major device number 508"

#: First line of ``sacct.txt``.
SACCT_HEADER: Final = (
    "JobID|JobIDRaw|JobName|User|Partition|Cluster|State|Submit|Start|End|NNodes|NodeList|AllocTRES|ExitCode"
)


def sacct_partition(num_nodes: int) -> str:
    """The Slurm partition a simulated job runs in: ``debug`` on one node, ``train`` on more.

    Derived from the job's size, so adding the column draws no random number (every other
    column, and the scenario matrix, stays as it was).
    """
    return "debug" if num_nodes <= 1 else "train"


#: The DCGM metrics written, with their ``# HELP`` text and ``# TYPE``.
DCGM_METRICS: Final[tuple[tuple[str, str, str], ...]] = (
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors.", "counter"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.", "counter"),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "Total number of double-bit persistent ECC errors.", "counter"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed", "gauge"),
    ("DCGM_FI_DEV_RETIRED_PENDING", "Total number of pages pending retirement.", "counter"),
)
_MODEL_NAME: Final = "NVIDIA A100-SXM4-80GB"
_CPUS_PER_GPU: Final = 8
_MEM_GB_PER_GPU: Final = 64
_WRITE_BUFFER: Final = 1 << 20
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


# ---------------------------------------------------------------------------------------------
# Time stamps


@lru_cache(maxsize=4096)
def _date(day: int) -> str:
    return (_EPOCH + timedelta(days=day)).strftime("%Y-%m-%d")


def _seconds_iso(seconds: int) -> str:
    day, second_of_day = divmod(seconds, 86_400)
    hours, rest = divmod(second_of_day, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{_date(day)}T{hours:02d}:{minutes:02d}:{secs:02d}"


def _iso_us(ts_us: int) -> str:
    """``2024-01-15T10:23:45.123456+00:00`` (journalctl ``short-iso`` with microseconds)."""
    seconds, micros = divmod(ts_us, 1_000_000)
    return f"{_seconds_iso(seconds)}.{micros:06d}+00:00"


def _sacct_time(ts_ms: int | None) -> str:
    """sacct's naive ``YYYY-MM-DDTHH:MM:SS`` (UTC here), ``Unknown`` for no time."""
    return "Unknown" if ts_ms is None else _seconds_iso(ts_ms // 1000)


# ---------------------------------------------------------------------------------------------
# Helpers

_HOST_RE: Final = re.compile(r"^(.*?)(\d+)$")


def _compress_hostlist(nodes: Sequence[str]) -> str:
    """Return Slurm's compressed form of a node list.

    Names ending in digits are grouped by prefix and digit width; runs of consecutive numbers
    become ranges.

    >>> _compress_hostlist(["node0001", "node0002", "node0003", "node0004", "node0007"])
    'node[0001-0004,0007]'
    >>> _compress_hostlist(["node0005"])
    'node0005'
    >>> _compress_hostlist([])
    'None assigned'
    """
    if not nodes:
        return "None assigned"
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for name in nodes:
        match = _HOST_RE.match(name)
        if match is None:
            plain.append(name)
            continue
        groups.setdefault((match[1], len(match[2])), []).append(int(match[2]))
    parts = sorted(set(plain))
    for (prefix, width), numbers in sorted(groups.items()):
        ordered = sorted(set(numbers))
        ranges: list[str] = []
        first = previous = ordered[0]
        for number in [*ordered[1:], None]:
            if number is not None and number == previous + 1:
                previous = number
                continue
            ranges.append(
                f"{first:0{width}d}" if first == previous else f"{first:0{width}d}-{previous:0{width}d}"
            )
            if number is not None:
                first = previous = number
        if len(ordered) == 1:
            parts.append(f"{prefix}{ranges[0]}")
        else:
            parts.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(parts)


def gpu_uuid(cluster: str, node: str, gpu: int) -> str:
    """Return a stable ``GPU-xxxxxxxx-...`` UUID for a GPU (a hash of its place, not random).

    >>> gpu_uuid("sim", "node0001", 0) == gpu_uuid("sim", "node0001", 0)
    True
    """
    digest = hashlib.blake2b(f"{cluster}/{node}/{gpu}".encode(), digest_size=16).digest()
    return f"GPU-{uuid.UUID(bytes=digest)}"


def _write_lines(path: Path, lines: Iterable[str], chunk: int = 20_000) -> None:
    with path.open("wb", buffering=_WRITE_BUFFER) as handle:
        batch: list[str] = []
        for line in lines:
            batch.append(line)
            if len(batch) >= chunk:
                handle.write(("\n".join(batch) + "\n").encode())
                batch.clear()
        if batch:
            handle.write(("\n".join(batch) + "\n").encode())


# ---------------------------------------------------------------------------------------------
# kernel.log


def _xid_payload(record: XidRecord) -> str:
    bus = pci_bus_id(record.gpu)
    who = (
        "pid='<unknown>', name=<unknown>"
        if record.pid is None
        else f"pid={record.pid}, name={record.process}"
    )
    return f"NVRM: Xid (PCI:{bus}): {record.xid}, {who}, {XID_MESSAGES[record.xid]}"


def _noise_text(line: KernelLine) -> str:
    variant = line.variant
    template = _NOISE_TEMPLATES[line.arg % len(_NOISE_TEMPLATES)]
    return template.format(
        a=1000 + variant % 90_000,
        b=variant % 8,
        c=2501 + variant % 4000,
        d=2500 + variant % 1000,
        e=f"{variant:07x}"[-7:],
        f=f"{line.ts_us // 1_000_000}.{(line.ts_us // 1000) % 1000:03d}:{variant % 100_000}",
    )


def _other_text(line: KernelLine, cluster: str, node: str) -> str:
    if line.kind == KernelLineKind.NOISE:
        return _noise_text(line)
    if line.kind == KernelLineKind.BOOT_DRIVER:
        return _BOOT_DRIVER
    if line.kind == KernelLineKind.BOOT_NVLINK:
        return _BOOT_NVLINK
    return f"NVRM: GPU at PCI:{pci_bus_id(line.arg)}: {gpu_uuid(cluster, node, line.arg)}"


def write_kernel_log(history: ClusterHistory, path: Path) -> int:
    """Write ``kernel.log``: every node's kernel lines, merged in time order.

    Parameters
    ----------
    history
        The simulated history.
    path
        File to (over)write.

    Returns
    -------
    int
        Number of lines written.
    """
    config = history.config
    names = config.node_names
    # Sort key: time, node, then a "GPU at" line before the XID it introduces, then the rest.
    keyed: list[tuple[int, int, int, int, str]] = []
    for seq, line in enumerate(history.kernel_lines):
        order = 0 if line.kind == KernelLineKind.GPU_AT else 2
        keyed.append((line.ts_us, line.node, order, seq, _other_text(line, config.cluster, names[line.node])))
    for seq, record in enumerate(history.xids):
        keyed.append((record.ts_us, record.node, 1, seq, _xid_payload(record)))
    keyed.sort()
    _write_lines(
        path, (f"{_iso_us(ts_us)} {names[node]} kernel: {text}" for ts_us, node, _, _, text in keyed)
    )
    return len(keyed)


# ---------------------------------------------------------------------------------------------
# sacct.txt


def _tres(cpus_gpus: int, nodes: int, *, billing: bool) -> str:
    cpus = cpus_gpus * _CPUS_PER_GPU
    prefix = f"billing={cpus}," if billing else ""
    return f"{prefix}cpu={cpus},gres/gpu={cpus_gpus},mem={cpus_gpus * _MEM_GB_PER_GPU}G,node={nodes}"


def _step_states(job: JobRecord) -> tuple[tuple[str, str], tuple[str, str]]:
    """``(state, exit code)`` of the ``.batch`` and ``.extern`` steps."""
    done = ("COMPLETED", "0:0")
    match job.state:
        case JobState.RUNNING:
            return ("RUNNING", "0:0"), ("RUNNING", "0:0")
        case JobState.COMPLETED:
            return done, done
        case JobState.FAILED:
            return ("FAILED", job.exit_code), done
        case JobState.OUT_OF_MEMORY:
            return ("OUT_OF_MEMORY", "0:125"), done
        case JobState.NODE_FAIL:
            return ("CANCELLED", "0:9"), ("CANCELLED", "0:9")
        case _:  # TIMEOUT, CANCELLED
            return ("CANCELLED", "0:15"), done


def _sacct_lines(history: ClusterHistory) -> Iterable[str]:
    config = history.config
    names = config.node_names
    cluster = config.cluster
    yield SACCT_HEADER
    for job in sorted(history.jobs, key=lambda record: (record.submit_ms, int(record.job_id))):
        nodes = len(job.nodes)
        hostlist = _compress_hostlist([names[node] for node in job.nodes])
        state = job.state.value
        if job.state is JobState.CANCELLED and job.cancelled_by is not None:
            state = f"CANCELLED by {job.cancelled_by}"
        times = f"{_sacct_time(job.submit_ms)}|{_sacct_time(job.start_ms)}|{_sacct_time(job.end_ms)}"
        job_tres = _tres(job.gpus, nodes, billing=True)
        partition = sacct_partition(nodes)
        yield (
            f"{job.job_id}|{job.job_id}|{job.name}|{job.user}|{partition}|{cluster}|{state}|{times}|"
            f"{nodes}|{hostlist}|{job_tres}|{job.exit_code}"
        )
        (batch_state, batch_exit), (extern_state, extern_exit) = _step_states(job)
        batch_tres = _tres(job.gpus_per_node_used, 1, billing=False)
        yield (
            f"{job.job_id}.batch|{job.job_id}.batch|batch||{partition}|{cluster}|{batch_state}|{times}|"
            f"1|{names[job.nodes[0]]}|{batch_tres}|{batch_exit}"
        )
        yield (
            f"{job.job_id}.extern|{job.job_id}.extern|extern||{partition}|{cluster}|{extern_state}|{times}|"
            f"{nodes}|{hostlist}|{job_tres}|{extern_exit}"
        )


def write_sacct(history: ClusterHistory, path: Path) -> int:
    """Write ``sacct.txt`` (``sacct -P`` with the columns of :data:`SACCT_HEADER`).

    Jobs are in submit order, so the file is not in end-time order; a job still running at the
    end of the span has State ``RUNNING`` and End ``Unknown``.

    Returns
    -------
    int
        Number of lines written, the header included.
    """
    lines = list(_sacct_lines(history))
    _write_lines(path, lines)
    return len(lines)


# ---------------------------------------------------------------------------------------------
# dcgm.prom


def _series_prefixes(history: ClusterHistory) -> list[list[str]]:
    """Per metric, the ``name{labels} `` prefix of every GPU's line (node-major order)."""
    config = history.config
    labels: list[str] = []
    for node in config.node_names:
        for gpu in range(config.gpus_per_node):
            domain, bus, device = pci_bus_id(gpu).split(":")
            dcgm_bus = f"{int(domain, 16):08X}:{bus.upper()}:{device.upper()}.0"
            labels.append(
                f'{{gpu="{gpu}",UUID="{gpu_uuid(config.cluster, node, gpu)}",pci_bus_id="{dcgm_bus}",'
                f'device="nvidia{gpu}",modelName="{_MODEL_NAME}",Hostname="{node}"}} '
            )
    return [[name + label for label in labels] for name, _, _ in DCGM_METRICS]


def _metric_block(
    prefixes: list[str], values: npt.NDArray[np.int64], ts_ms: int, rows: npt.NDArray[np.intp] | None
) -> str:
    """Sample lines of one metric; ``rows`` limits them to some GPUs (``None``: all)."""
    zero = f"0 {ts_ms}\n"
    if rows is None:
        nonzero = np.flatnonzero(values)
        if len(nonzero) == 0:
            return zero.join(prefixes) + zero
        suffixes = [zero] * len(prefixes)
        for row, value in zip(nonzero.tolist(), values[nonzero].tolist(), strict=True):
            suffixes[row] = f"{value} {ts_ms}\n"
        parts: list[str] = [""] * (2 * len(prefixes))
        parts[0::2] = prefixes
        parts[1::2] = suffixes
        return "".join(parts)
    return "".join(
        f"{prefixes[row]}{value} {ts_ms}\n"
        for row, value in zip(rows.tolist(), values[rows].tolist(), strict=True)
    )


def write_dcgm(history: ClusterHistory, path: Path, on_scrape: Callable[[int], None] | None = None) -> int:
    """Write ``dcgm.prom``: one DCGM exporter scrape of every GPU per ECC interval.

    Each scrape block has, per metric, ``# HELP`` and ``# TYPE`` lines and then one line per
    GPU of every node, ``NAME{gpu=..,UUID=..,pci_bus_id=..,device=..,modelName=..,Hostname=..}
    VALUE TIMESTAMP_MS``. With ``config.dcgm_changed_only`` a scrape after the first lists only
    the series whose value changed (much smaller; same reading for a delta-based consumer).

    Parameters
    ----------
    history
        The simulated history.
    path
        File to (over)write.
    on_scrape
        Called with the number of scrapes written so far, after each scrape.

    Returns
    -------
    int
        Number of scrapes written.
    """
    prefixes = _series_prefixes(history)
    headers = [f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n" for name, help_text, kind in DCGM_METRICS]
    changed_only = history.config.dcgm_changed_only
    previous: tuple[npt.NDArray[np.int64], ...] | None = None
    written = 0
    with path.open("wb", buffering=_WRITE_BUFFER) as handle:
        for scrape in iter_ecc_scrapes(history.config, history.ecc):
            current = (
                scrape.sbe_volatile,
                scrape.dbe_volatile,
                scrape.dbe_aggregate,
                scrape.remap_failure,
                scrape.retired_pending,
            )
            for index, values in enumerate(current):
                rows = None
                if changed_only and previous is not None:
                    rows = np.flatnonzero(values != previous[index])
                handle.write(headers[index].encode())
                handle.write(_metric_block(prefixes[index], values, scrape.ts_ms, rows).encode())
            previous = current
            written += 1
            if on_scrape is not None:
                on_scrape(written)
    return written
