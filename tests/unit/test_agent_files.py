"""The node agent's pure parts with real files: the file follower across rotations, the cursor
files, and the spool's bound, markers and repeats."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stream.agent.file_follower import FileFollower, FilePosition, Rotation
from stream.agent.journal import journal_entry_value
from stream.agent.spool import Spool
from stream.agent.state_file import StateFileError, read_state, write_state


def append(path: Path, *lines: bytes) -> None:
    with path.open("ab") as handle:
        handle.write(b"".join(line + b"\n" for line in lines))


# --- the file follower


def test_reads_complete_lines_only_and_resumes_from_its_position(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    append(log, b"one", b"two")
    follower = FileFollower(log, None, from_start=True)
    with log.open("ab") as handle:
        handle.write(b"unfinished")
    assert follower.poll() == [b"one", b"two"]
    append(log, b" now")
    assert follower.poll() == [b"unfinished now"]
    position = follower.position
    follower.close()
    append(log, b"three")
    again = FileFollower(log, position)
    assert again.poll() == [b"three"]
    assert again.poll() == []


def test_without_a_cursor_an_existing_file_is_read_from_its_end_a_new_one_whole(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    append(log, b"old")
    follower = FileFollower(log, None)
    append(log, b"new")
    assert follower.poll() == [b"new"]
    missing = FileFollower(tmp_path / "later.log", None)
    assert missing.poll() == []
    append(tmp_path / "later.log", b"first", b"second")
    assert missing.poll() == [b"first", b"second"]


def test_rename_and_create_finishes_the_old_file_then_reads_the_new(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    append(log, b"a")
    follower = FileFollower(log, None, from_start=True)
    assert follower.poll() == [b"a"]
    append(log, b"b")
    with log.open("ab") as handle:
        handle.write(b"c-without-newline")
    log.rename(tmp_path / "kern.log.1")
    rotation = Rotation()
    assert follower.poll(rotation) == [b"b"]  # no new file yet: the old one may still be written to
    assert rotation.renamed == 0
    append(log, b"d")
    rotation = Rotation()
    # A new file: the old one is read to its end, its unfinished last line included, then the new.
    assert follower.poll(rotation) == [b"c-without-newline", b"d"]
    assert rotation.renamed == 1


def test_copytruncate_reads_the_file_again_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    append(log, b"first line", b"second line")
    follower = FileFollower(log, None, from_start=True)
    assert len(follower.poll()) == 2
    os.truncate(log, 0)
    append(log, b"x")
    rotation = Rotation()
    assert follower.poll(rotation) == [b"x"]
    assert rotation.truncated == 1


def test_a_restart_after_a_rotation_reads_the_rest_of_the_rotated_file_first(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    append(log, b"a")
    follower = FileFollower(log, None, from_start=True)
    assert follower.poll() == [b"a"]
    position = follower.position
    follower.close()
    append(log, b"b")  # written while the agent was away, then rotated
    log.rename(tmp_path / "kern.log.1")
    append(log, b"c")
    again = FileFollower(log, position)
    assert again.poll() == [b"b", b"c"]


def test_a_restart_after_a_truncation_reads_from_the_start(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    append(log, b"a long first line")
    position = FilePosition(log.stat().st_ino, log.stat().st_size)
    os.truncate(log, 0)
    append(log, b"b")
    assert FileFollower(log, position).poll() == [b"b"]


def test_long_lines_are_cut_and_bytes_pass_as_they_are(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    append(log, b"\xff\xfe garbage \x00 bytes", b"x" * 1_000_000, b"after")
    follower = FileFollower(log, None, from_start=True, max_line_bytes=1000)
    lines = follower.poll()
    assert lines == [b"\xff\xfe garbage \x00 bytes", b"x" * 1000, b"after"]
    assert follower.truncated == 1


def test_file_positions_from_stored_state() -> None:
    assert FilePosition.from_state({"kind": "file", "inode": 3, "offset": 9}) == FilePosition(3, 9)
    assert FilePosition.from_state({"kind": "journal", "cursor": "s=1"}) is None
    assert FilePosition.from_state({"kind": "file", "inode": "3", "offset": -1}) is None
    assert FilePosition.from_state(None) is None


# --- cursor files


def test_state_files_are_replaced_whole_and_bad_ones_named(tmp_path: Path) -> None:
    path = tmp_path / "cursor.json"
    assert read_state(path) is None
    write_state(path, {"kind": "file", "inode": 1, "offset": 2})
    write_state(path, {"kind": "file", "inode": 1, "offset": 5})
    assert read_state(path) == {"kind": "file", "inode": 1, "offset": 5}
    assert not path.with_name("cursor.json.tmp").exists()
    path.write_text("{half")
    with pytest.raises(StateFileError, match=r"cursor\.json"):
        read_state(path)


# --- the spool


def records(count: int, size: int = 100, start: int = 0) -> list[tuple[str, bytes, bytes]]:
    return [("kernel-log", b"n1", b"%06d" % (start + n) + b"." * (size - 6)) for n in range(count)]


def test_the_spool_gives_records_back_in_order_and_survives_a_reopen(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", 1024 * 1024)
    spool.append(records(3), {"kind": "file", "inode": 1, "offset": 30})
    spool.append(records(2, start=3), {"kind": "file", "inode": 1, "offset": 50})
    batch = spool.pending(2)
    assert [entry.value[:6] for entry in batch] == [b"000000", b"000001"]
    spool.acknowledged(batch)
    spool.close()
    reopened = Spool(tmp_path / "spool", 1024 * 1024)
    assert [entry.value[:6] for entry in reopened.pending(10)] == [b"000002", b"000003", b"000004"]
    assert reopened.undelivered == 3
    assert reopened.last_position() == {"kind": "file", "inode": 1, "offset": 50}


def test_a_torn_last_entry_is_cut_off(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", 1024 * 1024)
    spool.append(records(2), {"kind": "file", "inode": 1, "offset": 20})
    spool.close()
    [segment] = (tmp_path / "spool").glob("*.seg")
    with segment.open("ab") as handle:
        handle.write(b"\x01\x02\x03 half an entry")
    reopened = Spool(tmp_path / "spool", 1024 * 1024)
    assert len(reopened.pending(10)) == 2
    assert reopened.last_position() == {"kind": "file", "inode": 1, "offset": 20}


def test_the_spool_stays_under_its_bound_and_counts_what_it_drops(tmp_path: Path) -> None:
    bound = 256 * 1024
    spool = Spool(tmp_path / "spool", bound)
    dropped = 0
    for n in range(100):  # 100 x 50 records of ~100 bytes: ~580 KB through a 256 KiB spool
        dropped += spool.append(records(50, start=n * 50), {"kind": "file", "inode": 1, "offset": n}).records
        assert spool.bytes <= bound
    kept = spool.pending(10_000)
    assert dropped > 0
    assert dropped + len(kept) == 5000  # nothing lost that was not counted
    assert [int(entry.value[:6]) for entry in kept] == list(range(5000 - len(kept), 5000))  # the newest kept
    assert spool.undelivered == len(kept)


def test_within_its_bound_the_spool_loses_nothing(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", 4 * 1024 * 1024)
    for n in range(100):
        assert spool.append(records(100, start=n * 100), None).records == 0
    seen = []
    while batch := spool.pending(777):
        seen += [int(entry.value[:6]) for entry in batch]
        spool.acknowledged(batch)
    assert seen == list(range(10_000))
    assert spool.undelivered == 0
    assert spool.bytes < 1024 * 1024  # spent segments were deleted


def test_records_being_sent_at_a_crash_are_counted_as_repeats_when_sent_again(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", 1024 * 1024)
    spool.append(records(5), None)
    batch = spool.pending(3)
    spool.sending(batch[-1].end)  # ... and the process dies before the acknowledgement is noted
    spool.close()
    again = Spool(tmp_path / "spool", 1024 * 1024)
    batch = again.pending(10)
    assert again.take_in_doubt(batch) == 3
    again.acknowledged(batch)
    assert again.take_in_doubt(again.pending(10)) == 0


def test_journal_entries_keep_the_fields_the_worker_reads() -> None:
    entry = {"MESSAGE": [98, 255], "_HOSTNAME": "n1", "__REALTIME_TIMESTAMP": "1", "__CURSOR": "s=1",
             "_BOOT_ID": "b", "_MACHINE_ID": "m"}  # fmt: skip
    assert journal_entry_value(entry, 1000) == (
        b'{"MESSAGE":[98,255],"_HOSTNAME":"n1","__REALTIME_TIMESTAMP":"1","_BOOT_ID":"b"}'
    )
    long = journal_entry_value({"MESSAGE": "x" * 100_000, "_HOSTNAME": "n1"}, 1000)
    assert len(long) <= 1000
