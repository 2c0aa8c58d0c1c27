"""Write the kernel-log corpus: the same driver messages in every shape the tools document.

Run from the repository root: ``python tests/data/kernel/corpus/generate.py``. It rewrites the
``*.log`` files of this folder and ``truth.jsonl`` (for each driver line that can be placed: file,
line, node, code, device, PCI id, time, and how exact the shape's time is). The output is committed;
rerun only to add a shape.

Shapes are written from the documentation, not from any one real file:

* util-linux ``dmesg(1)``: ``--time-format raw`` (default ``[ 1234.567890]``), ``ctime`` (``-T``:
  strftime ``%a %b %e %H:%M:%S %Y``, localized), ``iso`` (``%Y-%m-%dT%H:%M:%S,%06ld%+03d:%02d``),
  ``reltime`` (``-e``: ``[%b%d %H:%M]`` then ``[  +%5ld.%06ld]``), ``delta`` (``-d``:
  ``[ 1234.567890 <    0.000123>]``), ``notime`` (``-t``); ``-x``/``--decode`` prefixes
  ``%-6s:%-6s: `` facility and level.
* ``journalctl(1)`` ``-o``: ``short`` (``%b %d %H:%M:%S host kernel: ``, localized), ``short-precise``,
  ``short-iso`` (``+0000``), ``short-iso-precise``, ``short-full`` (``%a %Y-%m-%d %H:%M:%S %Z``),
  ``short-monotonic``, ``short-unix``, ``cat`` (message only).
* RFC 3164 (``<PRI>%b %e %H:%M:%S host tag: ``) and RFC 5424 (``<PRI>1 ISO host app procid msgid SD``).
* Month and weekday abbreviations from glibc's locale sources (``abmon``/``abday`` of
  /usr/share/i18n/locales/*), so the localized shapes are what ``LC_TIME`` prints.
* The driver's messages: ``NVRM: Xid (PCI:dddd:bb:dd): CODE, pid=..., name=..., text`` and the
  older and redacted ids people paste, ``NVRM: GPU dddd:bb:dd.f: GPU has fallen off the bus.``,
  indented continuation lines, and NVSwitch ``nvidia-nvswitchN: SXid (PCI:dddd:bb:dd.f): CODE,
  Fatal|Non-fatal, ...`` followed by its ``Severity`` and ``Data`` lines.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOCALES = Path("/usr/share/i18n/locales")
BOOT = datetime(2025, 1, 21, 0, 0, 0, tzinfo=UTC)
YEAR = 2025

GPU_MESSAGES = {
    13: "Graphics SM Warp Exception on (GPC 1, TPC 0, SM 1): Out Of Range Address",
    31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2c_3e000000. "
    "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000010",
    45: "Ch 00000008",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, "
    "subpartition 0.",
    63: "Row Remapper: New row (0x00000000000a3f1c) is marked for remapping, reboot GPU to activate.",
    64: "Row Remapper: Failed to remap row",
    74: "NVLink: fatal error detected on link 3(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate detected",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    109: "Ch 00000009, errorString CTX SWITCH TIMEOUT, Info 0x1c000",
    119: "Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL) "
    "(0x20800a4c 0x4).",
    120: "GSP task exception: PC=0x1e3f4 TVAL=0x0",
    154: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
}
SXID_MESSAGES = {
    12028: "Non-fatal, Link 33 egress non-posted PRIV error (First)",
    20034: "Fatal, Link 44 LTSSM Fault Up",
    11004: "Non-fatal, Link 02 ingress invalid ACL",
    19084: "Fatal, Link 08 AN1 Heartbeat Timeout Error",
    22013: "Fatal, Link 12 Minion Link DLREQ interrupt",
    24007: "Non-fatal, Link 30 SOE DMA error",
}
GPU_PCI = ["0000:07:00", "0000:0f:00", "0000:47:00", "0000:4e:00", "0000:87:00", "0000:90:00", "0000:b7:00",
           "0000:bd:00", "0000:3b:00", "0000:86:00"]  # fmt: skip
SWITCH_PCI = ["0000:05:00", "0000:06:00", "0000:c5:00", "0000:c6:00"]
PROCESSES = ["python", "python3", "pt_main_thread", "torchrun", "<unknown>"]


def glibc(locale: str) -> tuple[list[str], list[str]]:
    """(abmon, abday) of a glibc locale source, Sunday first for abday."""
    text = (LOCALES / locale).read_text(encoding="utf-8", errors="replace")

    def values(key: str) -> list[str]:
        match = re.search(rf"^{key}\s+(.*?)(?=^\S)", text, re.S | re.M)
        assert match, (locale, key)
        found = re.findall(r'"([^"]*)"', match.group(1))
        return [re.sub(r"<U([0-9A-Fa-f]{4,8})>", lambda m: chr(int(m.group(1), 16)), v) for v in found]

    return values("abmon"), values("abday")


@dataclass
class Event:
    ts: datetime
    host: str
    code: int
    pci: str
    device: str
    pid: int | None
    process: str
    message: str

    def text(self, pci_text: str | None = None) -> str:
        """The driver's message, as the driver prints it."""
        if self.device == "nvswitch":
            switch = SWITCH_PCI.index(self.pci)
            return f"nvidia-nvswitch{switch}: SXid (PCI:{pci_text or self.pci + '.0'}): {self.code}, {self.message}"
        parts = [f"NVRM: Xid (PCI:{self.pci if pci_text is None else pci_text}): {self.code}"]
        if self.pid is not None:
            parts.append(f"pid={self.pid}")
            parts.append(f"name={self.process}")
        parts.append(self.message)
        return ", ".join(parts)


def events(rng: random.Random, host: str, count: int, start: datetime, most_s: int = 5000) -> list[Event]:
    out = []
    ts = start
    for _ in range(count):
        ts += timedelta(seconds=rng.randint(0, most_s), microseconds=rng.randint(1, 999_999))
        if rng.random() < 0.25:
            code = rng.choice(sorted(SXID_MESSAGES))
            out.append(
                Event(ts, host, code, rng.choice(SWITCH_PCI), "nvswitch", None, "", SXID_MESSAGES[code])
            )
        else:
            code = rng.choice(sorted(GPU_MESSAGES))
            pid = rng.choice([None, rng.randint(1000, 4_000_000)])
            process = rng.choice(PROCESSES) if pid is not None else ""
            out.append(Event(ts, host, code, rng.choice(GPU_PCI), "gpu", pid, process, GPU_MESSAGES[code]))
    return out


class Writer:
    """Lines of one corpus file, with the truth of each driver line that can be placed."""

    def __init__(self, name: str, exact_ms: int = 1) -> None:
        self.name = name
        self.lines: list[str] = []
        self.truth: list[dict[str, object]] = []
        self.exact_ms = exact_ms

    def noise(self, text: str) -> None:
        self.lines.append(text)

    def event(self, line: str, event: Event, node: str | None = None, pci: str | None = None) -> None:
        self.lines.append(line)
        self.truth.append(
            {
                "file": self.name,
                "line": len(self.lines),
                "node": node or event.host,
                "code": event.code,
                "device": event.device,
                "pci_bus_id": event.pci if pci is None else pci,
                "ts_ms": round(event.ts.timestamp() * 1000) if self.exact_ms else None,
                "tolerance_ms": self.exact_ms,
            }
        )

    def sxid_details(self, prefix: str, event: Event) -> None:
        """The two lines the NVSwitch driver prints after an SXid: details of the same event."""
        switch = SWITCH_PCI.index(event.pci)
        head = f"{prefix}nvidia-nvswitch{switch}: SXid (PCI:{event.pci}.0): {event.code}, "
        self.lines.append(head + f"Severity {5 if 'Fatal' in event.message else 0} Engine instance 33 "
                                 "Sub-engine instance 00")  # fmt: skip
        self.lines.append(head + "Data {0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000004}")

    def write(self) -> None:
        (HERE / self.name).write_text("\n".join(self.lines) + "\n", encoding="utf-8")


def uptime(ts: datetime) -> str:
    seconds = (ts - BOOT).total_seconds()
    return f"[{seconds:12.6f}]"


NOISE = [
    "nvidia-uvm: Loaded the UVM driver, major device number 506.",
    "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Quota mode: none.",
    "NVRM: GPU at PCI:0000:3b:00: GPU-5a3b1c2d-1111-2222-3333-444455556666",
    "NVRM: GPU Board Serial Number: 1324021034567",
    "mlx5_core 0000:0c:00.0: mlx5_fw_tracer_handle_traces:761: FW tracer event",
]


def write_shape(name: str, rng: random.Random, host: str, line_of, *, exact_ms: int = 1,
                node: str | None = None, details: bool = True, count: int = 12) -> Writer:  # fmt: skip
    """A file of one shape: ``line_of(event, text) -> (prefix, line)`` formats each message."""
    out = Writer(name, exact_ms)
    for event in events(rng, host, count, BOOT + timedelta(minutes=rng.randint(1, 600))):
        if rng.random() < 0.5:
            _, noise_line = line_of(event, rng.choice(NOISE))
            out.noise(noise_line)
        prefix, line = line_of(event, event.text())
        out.event(line, event, node)
        if event.device == "nvswitch" and details:
            out.sxid_details(prefix, event)
    out.write()
    return out


def main() -> None:
    rng = random.Random(13)
    writers: list[Writer] = []

    # util-linux dmesg ----------------------------------------------------------------------------
    def raw(event: Event, text: str) -> tuple[str, str]:
        prefix = f"{uptime(event.ts)} "
        return prefix, prefix + text

    writers.append(write_shape("gpu-a17.dmesg-raw.log", rng, "gpu-a17", raw))

    def decode_raw(event: Event, text: str) -> tuple[str, str]:
        prefix = f"kern  :warn  : {uptime(event.ts)} "
        return prefix, prefix + text

    writers.append(write_shape("gpu-a18.dmesg-x.log", rng, "gpu-a18", decode_raw))

    def delta(event: Event, text: str) -> tuple[str, str]:
        seconds = (event.ts - BOOT).total_seconds()
        prefix = f"[{seconds:12.6f} <{rng.uniform(0, 9):12.6f}>] "
        return prefix, prefix + text

    writers.append(write_shape("gpu-a19.dmesg-d.log", rng, "gpu-a19", delta))

    def iso(event: Event, text: str, decode: bool = False) -> tuple[str, str]:
        stamp = event.ts.strftime("%Y-%m-%dT%H:%M:%S,%f+00:00")
        prefix = ("kern  :err   : " if decode else "") + stamp + " "
        return prefix, prefix + text

    writers.append(write_shape("gpu-a20.dmesg-iso.log", rng, "gpu-a20", iso))
    writers.append(write_shape("gpu-a21.dmesg-x-iso.log", rng, "gpu-a21", lambda e, t: iso(e, t, True)))

    # ctime (-T) in each LC_TIME language: weekday and month from glibc's locale sources.
    for locale in ("en_US", "de_DE", "fr_FR", "es_ES", "it_IT", "pt_BR", "nl_NL", "pl_PL", "ru_RU", "cs_CZ",
                   "sv_SE", "tr_TR", "ja_JP", "zh_CN"):  # fmt: skip
        abmon, abday = glibc(locale)

        def ctime(
            event: Event, text: str, abmon: list[str] = abmon, abday: list[str] = abday
        ) -> tuple[str, str]:
            ts = event.ts
            weekday = abday[(ts.weekday() + 1) % 7]
            prefix = f"[{weekday} {abmon[ts.month - 1]} {ts.day:2d} {ts:%H:%M:%S} {ts.year}] "
            return prefix, prefix + text

        host = f"gpu-c{locale.lower().replace('_', '')}"
        writers.append(write_shape(f"{host}.dmesg-T.{locale}.log", rng, host, ctime, exact_ms=1000))

        def short(event: Event, text: str, abmon: list[str] = abmon) -> tuple[str, str]:
            ts = event.ts
            prefix = f"{abmon[ts.month - 1]} {ts.day:02d} {ts:%H:%M:%S} {event.host} kernel: "
            return prefix, prefix + text

        writers.append(
            write_shape(f"journal-short.{locale}.log", rng, f"node-{locale[:2]}01", short, exact_ms=1000)
        )

    # dmesg --reltime: a minute line, then deltas within the minute (needs --year; to the minute).
    out = Writer("gpu-a22.dmesg-e.log", exact_ms=60_000)
    last_minute = None
    previous = None
    for event in events(rng, "gpu-a22", 24, BOOT + timedelta(hours=3), most_s=25):
        minute = event.ts.replace(second=0, microsecond=0)
        if minute != last_minute:
            stamp = f"[{event.ts:%b%d %H:%M}] "
            last_minute = minute
        else:
            assert previous is not None
            step = (event.ts - previous).total_seconds()
            stamp = f"[  +{step:.6f}] "
        previous = event.ts
        out.event(stamp + event.text(), event)
    out.write()
    writers.append(out)

    # journalctl -o ----------------------------------------------------------------------------
    def short_precise(event: Event, text: str) -> tuple[str, str]:
        prefix = f"{event.ts:%b %d %H:%M:%S.%f} {event.host} kernel: "
        return prefix, prefix + text

    writers.append(write_shape("journal-short-precise.log", rng, "node-sp01", short_precise))

    def short_iso(event: Event, text: str) -> tuple[str, str]:
        prefix = f"{event.ts:%Y-%m-%dT%H:%M:%S}+0000 {event.host} kernel: "
        return prefix, prefix + text

    writers.append(write_shape("journal-short-iso.log", rng, "node-si01", short_iso, exact_ms=1000))

    def short_iso_precise(event: Event, text: str) -> tuple[str, str]:
        prefix = f"{event.ts:%Y-%m-%dT%H:%M:%S.%f}+00:00 {event.host} kernel: "
        return prefix, prefix + text

    writers.append(write_shape("journal-short-iso-precise.log", rng, "node-sip01", short_iso_precise))

    def short_full(event: Event, text: str) -> tuple[str, str]:
        prefix = f"{event.ts:%a %Y-%m-%d %H:%M:%S} UTC {event.host} kernel: "
        return prefix, prefix + text

    writers.append(write_shape("journal-short-full.log", rng, "node-sf01", short_full, exact_ms=1000))

    def short_monotonic(event: Event, text: str) -> tuple[str, str]:
        prefix = f"{uptime(event.ts)} {event.host} kernel: "
        return prefix, prefix + text

    writers.append(write_shape("journal-short-monotonic.log", rng, "node-sm01", short_monotonic))

    def short_unix(event: Event, text: str) -> tuple[str, str]:
        prefix = f"{event.ts.timestamp():.6f} {event.host} kernel: "
        return prefix, prefix + text

    writers.append(write_shape("journal-short-unix.log", rng, "node-su01", short_unix))

    # syslog ----------------------------------------------------------------------------------
    def rfc3164(event: Event, text: str) -> tuple[str, str]:
        ts = event.ts
        prefix = f"<4>{ts:%b} {ts.day:2d} {ts:%H:%M:%S} {event.host} kernel: {uptime(ts)} "
        return prefix, prefix + text

    writers.append(write_shape("syslog-rfc3164.log", rng, "node-r3", rfc3164, exact_ms=1000))

    def rfc5424(event: Event, text: str) -> tuple[str, str]:
        prefix = f"<4>1 {event.ts:%Y-%m-%dT%H:%M:%S.%f}+00:00 {event.host} kernel - - - "
        return prefix, prefix + text

    writers.append(write_shape("syslog-rfc5424.log", rng, "node-r5", rfc5424))

    # Pasted into issues and chats: wrappers, old and redacted ids, continuations -------------------
    out = Writer("pasted-issue-gpu-p01.md", exact_ms=1000)
    wrappers = [
        lambda line: "```" + line,
        lambda line: "```text " + line,
        lambda line: "> " + line,
        lambda line: "> > " + line,
        lambda line: "`" + line + "`",
        lambda line: "**" + line + "**",
        lambda line: "> `" + line + "`",
        lambda line: line + "```",
    ]
    for index, event in enumerate(events(rng, "gpu-p01", 24, BOOT + timedelta(hours=5))):
        ts = event.ts
        line = f"{ts:%b} {ts.day:2d} {ts:%H:%M:%S} {event.host} kernel: {event.text()}"
        out.noise("Here is what the node printed:")
        out.event(wrappers[index % len(wrappers)](line), event)
    out.write()
    writers.append(out)

    out = Writer("gpu-p02.dmesg-T.ids.log", exact_ms=1000)
    for index, event in enumerate(e for e in events(rng, "gpu-p02", 30, BOOT) if e.device == "gpu"):
        ts = event.ts
        prefix = f"[{ts:%a %b} {ts.day:2d} {ts:%H:%M:%S %Y}] "
        if index % 3 == 0:  # the two-field id of old drivers: domain and bus
            out.event(prefix + event.text(pci_text=event.pci[:7]), event)
        elif index % 3 == 1:  # redacted before posting: no PCI id to read
            out.event(
                prefix + event.text(pci_text=rng.choice(["...", "xxxx:xx:xx", "<redacted>"])), event, pci=""
            )
        else:
            out.event(prefix + event.text(pci_text=event.pci.upper() + ".0"), event)
    out.write()
    writers.append(out)

    # Messages on several lines, and a GPU that fell off the bus without an Xid number.
    out = Writer("gpu-m01.dmesg-T.multiline.log", exact_ms=1000)
    for index, event in enumerate(events(rng, "gpu-m01", 16, BOOT)):
        ts = event.ts
        prefix = f"[{ts:%a %b} {ts.day:2d} {ts:%H:%M:%S %Y}] "
        if event.device == "gpu" and index % 4 == 1:
            gone = Event(ts, event.host, 79, event.pci, "gpu", None, "", "")
            out.event(f"{prefix}NVRM: GPU {event.pci}.0: GPU has fallen off the bus.", gone)
            continue
        out.event(prefix + event.text(), event)
        indent = " " * len(prefix)
        out.noise(f"{indent}NVRM: continued: state 0x{rng.randint(0, 1 << 32):08x}")
        if event.device == "nvswitch":
            out.sxid_details(prefix, event)
    out.write()
    writers.append(out)

    # No time stamps: cannot be placed (truth is empty; the test expects one reason per file).
    for name, prefix in (("gpu-n01.dmesg-t.log", ""), ("gpu-n02.dmesg-x-t.log", "kern  :warn  : ")):
        out = Writer(name)
        for event in events(rng, "n", 8, BOOT):
            out.noise(prefix + event.text())
        out.write()
    out = Writer("journal-cat.log")
    for event in events(rng, "n", 8, BOOT):
        out.noise(event.text())
    out.write()

    with (HERE / "truth.jsonl").open("w", encoding="utf-8") as handle:
        for writer in writers:
            for row in writer.truth:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
