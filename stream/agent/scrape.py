"""The agent's optional GPU counters: the local dcgm-exporter scraped, or ``nvidia-smi -q`` run,
every N seconds, read by the same parsers as ``replay`` reads their files.

Each scrape gives one ECC sample per GPU (:class:`schemas.records.EccSample`), stamped with the
scrape's time when the exporter gives none and with the agent's node when it has no ``Hostname``
label, encoded and keyed as ``replay --to`` sends them (:mod:`stream.kafka.codec`). The exporter's
XID gauge is not published: the kernel log the agent follows is the complete source of XIDs, and
each scrape is parsed alone, so a change of the gauge could not be told from a value it kept. A
value the parser cannot use is counted and skipped.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
import urllib.request

from schemas.records import EccSample, InvalidRecord
from stream.inputs.parsers.dcgm import parse_dcgm
from stream.inputs.parsers.nvidia_smi import parse_nvidia_smi
from stream.inputs.parsers.options import ParseOptions
from stream.kafka.codec import encode_record, record_key

__all__ = ["EccRecords", "ecc_records_of_dcgm", "ecc_records_of_nvidia_smi", "run_nvidia_smi", "scrape_url"]

_log = logging.getLogger("faultstream.agent")

#: ``(topic, key, value)`` records for the spool, and how many values could not be used.
EccRecords = tuple[list[tuple[str, bytes, bytes]], int]


def _records(items: object, topic: str) -> EccRecords:
    records, unreadable = [], 0
    for item in items:  # type: ignore[attr-defined]
        if isinstance(item, EccSample):
            records.append((topic, record_key(item), encode_record(item)))
        elif isinstance(item, InvalidRecord):
            unreadable += 1
            _log.debug("unreadable counter: %s", item)
    return records, unreadable


def ecc_records_of_dcgm(text: bytes, node: str, cluster: str, topic: str, now_ms: int) -> EccRecords:
    """The ECC records of one dcgm-exporter scrape.

    >>> scrape = b'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0",pci_bus_id="00000000:3B:00.0"} 2\\n'
    >>> [(topic, key) for topic, key, _ in ecc_records_of_dcgm(scrape, "n1", "c", "ecc", 1)[0]]
    [('ecc', b'n1')]
    """
    options = ParseOptions(cluster=cluster, node=node, scrape_time_ms=now_ms)
    return _records(parse_dcgm(text.splitlines(), options, "dcgm-exporter"), topic)


def ecc_records_of_nvidia_smi(text: bytes, node: str, cluster: str, topic: str) -> EccRecords:
    """The ECC records of one ``nvidia-smi -q`` run."""
    options = ParseOptions(cluster=cluster, node=node)
    return _records(parse_nvidia_smi(text.splitlines(), options, "nvidia-smi"), topic)


async def scrape_url(url: str, timeout_s: float = 10.0) -> bytes:
    """The body of ``url`` (run in a thread: urllib blocks)."""

    def fetch() -> bytes:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body: bytes = response.read(64 * 1024 * 1024)
            return body

    return await asyncio.to_thread(fetch)


async def run_nvidia_smi(command: str, timeout_s: float = 60.0) -> bytes:
    """The output of ``nvidia-smi -q``; OSError when it cannot run or fails."""
    path = shutil.which(command) or command
    process = await asyncio.create_subprocess_exec(
        path, "-q", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise OSError(f"{command} -q did not answer in {timeout_s:.0f} s") from None
    if process.returncode != 0:
        raise OSError(f"{command} -q failed ({process.returncode}): {err.decode(errors='replace')[:300]}")
    return out


def now_ms() -> int:
    return int(time.time() * 1000)
