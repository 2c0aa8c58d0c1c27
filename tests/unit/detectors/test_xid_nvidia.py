"""The generated catalog (detectors/xid_nvidia.py) says what NVIDIA's spreadsheet says."""

import dataclasses
import hashlib
import importlib.util
from pathlib import Path

import pytest

from detectors import xid_nvidia

ROOT = Path(__file__).resolve().parents[3]
XLSX = ROOT / xid_nvidia.SOURCE_FILE


def load_generator():
    spec = importlib.util.spec_from_file_location(
        "generate_xid_catalog", ROOT / "scripts" / "generate_xid_catalog.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_source_file_is_the_one_generated_from():
    assert hashlib.sha256(XLSX.read_bytes()).hexdigest() == xid_nvidia.SOURCE_SHA256
    readme = (XLSX.parent / "README.md").read_text()
    assert xid_nvidia.SOURCE_SHA256 in readme and xid_nvidia.SOURCE_MODIFIED in readme
    license_text = (XLSX.parent / "LICENSE").read_text()  # the Apache-2.0 notice travels with the file
    assert "Apache License" in license_text and "Version 2.0" in license_text


def test_the_generated_module_matches_the_spreadsheet():
    pytest.importorskip("openpyxl")
    generator = load_generator()
    data = generator.read_workbook(XLSX)
    assert data["modified"] == xid_nvidia.SOURCE_MODIFIED
    assert {code: dataclasses.asdict(x) for code, x in xid_nvidia.XIDS.items()} == {
        code: {**fields, "applies_to": tuple(fields["applies_to"])} for code, fields in data["xids"].items()
    }
    assert [dataclasses.asdict(row) for row in xid_nvidia.NVLINK_DECODE] == data["nvlink_decode"]
    assert data["buckets"] == xid_nvidia.RESOLUTION_BUCKETS


def test_regenerating_gives_the_checked_in_file(tmp_path):
    pytest.importorskip("openpyxl")
    out = tmp_path / "xid_nvidia.py"
    assert load_generator().main(["--out", str(out)]) == 0
    assert out.read_text() == (ROOT / "detectors" / "xid_nvidia.py").read_text()


def test_every_code_from_1_to_the_newest_is_in_the_catalog():
    assert set(xid_nvidia.XIDS) == set(range(1, max(xid_nvidia.XIDS) + 1))
    assert max(xid_nvidia.XIDS) >= 172
