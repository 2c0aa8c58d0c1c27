"""Output formats of the simulator: kernel.log, sacct.txt, dcgm.prom, and their agreement with truth."""

from __future__ import annotations

import itertools
import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from schemas.timeutil import parse_ts
from stream.simulator import SimulationConfig, Truth, simulate
from stream.simulator.config import DGX_A100_PCI_BUS_IDS
from stream.simulator.writers import SACCT_HEADER, _compress_hostlist

# Many faults on a small cluster, so every code path shows in a short run.
CONFIG = SimulationConfig(nodes=24, days=5, seed=7, ecc_interval_minutes=120, hardware_failure_rate=150)

JOURNAL_RE = re.compile(
    r"^(?P<ts>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}\+00:00) (?P<node>node\d{4}) kernel: (?P<text>.+)$"
)
XID_PAYLOAD_RE = re.compile(
    r"^NVRM: Xid \(PCI:(?P<bus>[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2})\): (?P<xid>\d+), "
    r"pid=(?P<pid>\d+|'<unknown>'), name=(?P<name>[^,]+), (?P<message>\S.*)$"
)
DCGM_LINE_RE = re.compile(r"^(?P<metric>DCGM_FI_DEV_\w+)\{(?P<labels>[^}]*)\} (?P<value>\d+) (?P<ts>\d{13})$")
LABEL_RE = re.compile(r'(\w+)="([^"]*)"')
TERMINAL_STATES = {"COMPLETED", "FAILED", "NODE_FAIL", "TIMEOUT", "CANCELLED", "OUT_OF_MEMORY"}
VOLATILE = {
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_RETIRED_PENDING",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Truth]:
    out = tmp_path_factory.mktemp("sim")
    calls: list[tuple[int, int]] = []
    truth = simulate(CONFIG, out, progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (CONFIG.scrape_count + 4, CONFIG.scrape_count + 4)
    assert [done for done, _ in calls] == list(range(1, len(calls) + 1))
    return out, truth


def _expand(hostlist: str) -> list[str]:
    """Tiny expander for the ``prefix[0001-0004,0007]`` form the writer produces."""
    match = re.fullmatch(r"(?P<prefix>[a-z]+)\[(?P<ranges>[0-9,-]+)\]", hostlist)
    if match is None:
        return [hostlist]
    names = []
    for part in match["ranges"].split(","):
        first, _, last = part.partition("-")
        width = len(first)
        for number in range(int(first), int(last or first) + 1):
            names.append(f"{match['prefix']}{number:0{width}d}")
    return names


def _sacct_rows(path: Path, *, partition: bool = False) -> list[list[str]]:
    """The rows' fields; without the Partition column (the fifth) unless ``partition``, so the
    positions below are those of the columns before it."""
    lines = path.read_text().splitlines()
    assert lines[0] == SACCT_HEADER
    rows = [line.split("|") for line in lines[1:]]
    return rows if partition else [row[:4] + row[5:] for row in rows]


def test_same_config_gives_identical_bytes(tmp_path: Path) -> None:
    config = SimulationConfig(nodes=12, days=2, seed=3, ecc_interval_minutes=180, hardware_failure_rate=200)
    simulate(config, tmp_path / "a")
    simulate(config, tmp_path / "b")
    names = sorted(path.name for path in (tmp_path / "a").iterdir())
    assert names == ["dcgm.prom", "kernel.log", "sacct.txt", "truth.json"]
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    simulate(SimulationConfig(nodes=12, days=2, seed=4, ecc_interval_minutes=180), tmp_path / "c")
    assert (tmp_path / "c" / "sacct.txt").read_bytes() != (tmp_path / "a" / "sacct.txt").read_bytes()


def test_kernel_log_lines_are_journal_lines_in_time_order(run: tuple[Path, Truth]) -> None:
    out, truth = run
    lines = (out / "kernel.log").read_text().splitlines()
    stamps = []
    xid_codes: Counter[int] = Counter()
    noise = boots = 0
    for line in lines:
        match = JOURNAL_RE.match(line)
        assert match is not None, line
        stamps.append(match["ts"])
        text = match["text"]
        if "NVRM: Xid" in text:
            payload = XID_PAYLOAD_RE.match(text)
            assert payload is not None, line
            assert payload["bus"] in DGX_A100_PCI_BUS_IDS
            xid_codes[int(payload["xid"])] += 1
        else:
            noise += 1
            boots += "NVRM: loading NVIDIA" in text or "Nvlink Core" in text
    assert stamps == sorted(stamps)
    assert dict(xid_codes) == dict(truth.xid_counts)
    # Noise scales with the XIDs of faults and jobs; storms and flapping links add none (this run
    # has no lemon node, whose extra XIDs would not either).
    assert not truth.lemon_nodes
    planted = ("xid_storm", "job_xid_storm", "nvlink_flapping")
    bursts = sum(f.details["lines"] for f in truth.faults if f.kind in planted)
    total = sum(xid_codes.values()) - bursts
    assert 2.5 * total <= noise - boots <= 4 * total
    assert any("mlx5_core" in line for line in lines) and any("EXT4-fs" in line for line in lines)


def test_every_fault_has_its_xid_line_at_the_onset(run: tuple[Path, Truth]) -> None:
    out, truth = run
    assert len(truth.faults) >= 5
    seen: set[tuple[str, str, int, int]] = set()
    for line in (out / "kernel.log").read_text().splitlines():
        match = JOURNAL_RE.match(line)
        assert match is not None
        payload = XID_PAYLOAD_RE.match(match["text"])
        if payload is not None:
            seen.add((match["node"], payload["bus"], int(payload["xid"]), parse_ts(match["ts"])))
    for fault in truth.faults:
        if fault.kind in ("ecc_degradation", "lemon_node"):
            assert fault.xid is None  # evidence in dcgm.prom, or no onset line of its own
            continue
        assert fault.xid is not None
        assert (fault.node, fault.pci_bus_id, fault.xid, fault.onset_ms) in seen, fault


def test_sacct_jobs_have_steps_and_submit_order(run: tuple[Path, Truth]) -> None:
    out, truth = run
    rows = _sacct_rows(out / "sacct.txt")
    assert all(len(row) == len(SACCT_HEADER.split("|")) - 1 for row in rows)  # less Partition
    jobs = rows[0::3]
    assert len(jobs) == truth.jobs
    for index in range(0, len(rows), 3):
        job, batch, extern = rows[index : index + 3]
        assert "." not in job[0] and job[0] == job[1]
        assert batch[0] == f"{job[0]}.batch" and batch[2] == "batch"
        assert extern[0] == f"{job[0]}.extern" and extern[2] == "extern"
        assert batch[6:9] == job[6:9] == extern[6:9]
        assert extern[10] == job[10] and batch[10] == _expand(job[10])[0]
        assert int(job[9]) == len(_expand(job[10]))
        assert re.fullmatch(r"billing=\d+,cpu=\d+,gres/gpu=\d+,mem=\d+G,node=\d+", job[11])
        assert re.fullmatch(r"\d+:\d+", job[12])
        state = job[5]
        if state == "RUNNING":
            assert job[8] == "Unknown"
        else:
            assert state.split(" by ")[0] in TERMINAL_STATES
            assert parse_ts(job[8]) >= parse_ts(job[7]) >= parse_ts(job[6])
    submits = [job[6] for job in jobs]
    assert submits == sorted(submits)
    ends = [job[8] for job in jobs if job[8] != "Unknown"]
    assert ends != sorted(ends), "sacct is in submit order, not end order"
    assert any(job[5].startswith("CANCELLED by ") for job in jobs)


def test_sacct_partition_follows_the_job_size(run: tuple[Path, Truth]) -> None:
    out, _ = run
    assert SACCT_HEADER.split("|")[4] == "Partition"
    rows = _sacct_rows(out / "sacct.txt", partition=True)
    for index in range(0, len(rows), 3):
        job, batch, extern = rows[index : index + 3]
        assert job[4] == batch[4] == extern[4] == ("debug" if int(job[10]) == 1 else "train")
    assert {row[4] for row in rows} == {"debug", "train"}


def test_truth_job_failures_agree_with_sacct(run: tuple[Path, Truth]) -> None:
    out, truth = run
    from_sacct = {}
    for job in _sacct_rows(out / "sacct.txt")[0::3]:
        state = job[5].split(" by ")[0]
        if state not in ("COMPLETED", "RUNNING"):
            from_sacct[job[0]] = (state, parse_ts(job[8]), tuple(_expand(job[10])))
    from_truth = {
        failure.job_id: (failure.state.value, failure.end_ms, failure.nodes) for failure in truth.job_failures
    }
    assert from_truth == from_sacct
    assert truth.jobs_failed == len(truth.job_failures)
    hardware = [failure for failure in truth.job_failures if failure.hardware]
    assert len(hardware) == truth.hardware_failures > 0
    fault_ids = {fault.fault_id: fault for fault in truth.faults}
    for failure in hardware:
        assert failure.state.value in ("FAILED", "NODE_FAIL")
        assert failure.fault_id is not None
        fault = fault_ids[failure.fault_id]
        assert fault.node in failure.nodes and fault.job_id == failure.job_id
        assert 0 < failure.end_ms - fault.onset_ms <= 241_000


def _dcgm_series(path: Path) -> dict[tuple[str, str, str], list[tuple[int, int]]]:
    series: dict[tuple[str, str, str], list[tuple[int, int]]] = defaultdict(list)
    help_seen: set[str] = set()
    for line in path.read_text().splitlines():
        if line.startswith("# HELP "):
            help_seen.add(line.split()[2])
            continue
        if line.startswith("# TYPE "):
            assert line.split()[2] in help_seen
            continue
        match = DCGM_LINE_RE.match(line)
        assert match is not None, line
        labels = dict(LABEL_RE.findall(match["labels"]))
        assert list(labels) == ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"]
        assert re.fullmatch(
            r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", labels["UUID"]
        )
        assert re.fullmatch(r"00000000:[0-9A-F]{2}:00\.0", labels["pci_bus_id"])
        key = (match["metric"], labels["Hostname"], labels["gpu"])
        series[key].append((int(match["ts"]), int(match["value"])))
    return series


def test_dcgm_scrapes_cover_every_gpu_with_timestamps(run: tuple[Path, Truth]) -> None:
    out, _ = run
    series = _dcgm_series(out / "dcgm.prom")
    assert len(series) == 5 * CONFIG.nodes * CONFIG.gpus_per_node
    expected = [
        CONFIG.start_ms + k * CONFIG.ecc_interval_minutes * 60_000 for k in range(CONFIG.scrape_count)
    ]
    for samples in series.values():
        assert [ts for ts, _ in samples] == expected


def test_dcgm_counters_only_drop_at_a_repair_or_maintenance(run: tuple[Path, Truth]) -> None:
    out, truth = run
    repairs: dict[str, list[int]] = defaultdict(list)
    for fault in truth.faults:
        if fault.repaired_ms is not None:
            repairs[fault.node].append(fault.repaired_ms)
    for item in truth.maintenance:
        repairs[item.node].append(item.reboot_ms)
    drops = 0
    rises: Counter[str] = Counter()
    for (metric, node, _), samples in _dcgm_series(out / "dcgm.prom").items():
        for (before_ts, before), (after_ts, after) in itertools.pairwise(samples):
            if after > before:
                rises[metric] += 1
            if after < before:
                assert metric in VOLATILE, (metric, node)
                assert any(before_ts < repaired <= after_ts for repaired in repairs[node]), (metric, node)
                drops += 1
    assert drops > 0
    assert rises["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"] > 0 and rises["DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"] > 0


def test_dcgm_changed_only_lists_changes_after_a_full_first_scrape(tmp_path: Path) -> None:
    full = SimulationConfig(nodes=10, days=3, seed=2, ecc_interval_minutes=60, hardware_failure_rate=200)
    sparse = SimulationConfig(**{**_fields(full), "dcgm_changed_only": True})
    simulate(full, tmp_path / "full")
    simulate(sparse, tmp_path / "sparse")
    full_series = _dcgm_series(tmp_path / "full" / "dcgm.prom")
    sparse_series = _dcgm_series(tmp_path / "sparse" / "dcgm.prom")
    assert full_series.keys() == sparse_series.keys()
    for key, samples in full_series.items():
        changes = [samples[0]] + [now for before, now in itertools.pairwise(samples) if now[1] != before[1]]
        assert sparse_series[key] == changes
    assert (tmp_path / "sparse" / "dcgm.prom").stat().st_size < (
        tmp_path / "full" / "dcgm.prom"
    ).stat().st_size / 5


def _fields(config: SimulationConfig) -> dict[str, object]:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["node0001", "node0002", "node0003", "node0004", "node0007"], "node[0001-0004,0007]"),
        (["node0009"], "node0009"),
        (["node0010", "node0009"], "node[0009-0010]"),
        (["node0001", "node0003", "node0005"], "node[0001,0003,0005]"),
        (["a1", "b2"], "a1,b2"),
        ([], "None assigned"),
    ],
)
def test_compress_hostlist(names: list[str], expected: str) -> None:
    assert _compress_hostlist(names) == expected
