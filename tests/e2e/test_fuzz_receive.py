"""Hostile remote_write bodies among good ones, through a real ``faultstream receive`` and broker.

Truncated snappy, garbage protobuf, random bytes, empty bodies, bit flips in real Prometheus 2.42
bodies and requests of 10,000 series: the receiver must not stop, each body must get the answer
its own decoder gives (a 400 with the reason, or a 204), every bad body or series must be one
dead letter, and every sample of the good bodies around them must reach the ``ecc`` topic.
``tests/soak/fuzz.py --receive-bodies N`` prints the same figures for more bodies.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.services.fuzz_receive import DATA, hostile_bodies, run_receive_fuzz

pytestmark = [pytest.mark.e2e, pytest.mark.load_tolerant]


def test_the_hostile_bodies_cover_every_kind() -> None:
    real = [path.read_bytes() for path in sorted(DATA.glob("*.bin"))]
    bodies = hostile_bodies(300, seed=15, real=real)
    assert {body.what for body in bodies} == {
        "good", "truncated snappy", "garbage protobuf", "random bytes", "empty", "bit flips", "10,000 series",
    }  # fmt: skip
    assert all(body.status == 400 for body in bodies if body.what in ("truncated snappy", "empty"))
    assert sum(body.status == 400 for body in bodies) >= 100
    assert all(body.samples == 5000 and body.letters == 3 for body in bodies if body.what == "10,000 series")


def test_hostile_bodies_crash_nothing_and_every_bad_one_has_a_reason(bootstrap: str, tmp_path: Path) -> None:
    report = run_receive_fuzz(bootstrap, tmp_path, 300, seed=15)
    assert report.receiver_alive and report.tracebacks == 0
    assert report.wrong_status == [] and report.reasons_missing == 0
    assert report.letters_on_topic == report.letters_expected > 100
    assert report.samples_on_topic == report.samples_expected > 5000
