"""`faultstream explain`: codes and pasted kernel-log lines, what they parse to and what they mean."""

import io
import json

import pytest

from stream.cli.main import main

LINE_48 = "Jun 12 10:00:01 gpu-node7 kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=1234, name=python, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer"
LINE_63 = "Jun 12 10:00:02 gpu-node7 kernel: NVRM: Xid (PCI:0000:3b:00): 63, pid=1234, name=python, Row Remapper: New row marked for remapping, reset gpu to activate."
SXID = "Jun 12 10:00:01 gpu-node7 kernel: nvidia-nvswitch0: SXid (PCI:0000:c2:00.0): 20034, Fatal, Link 28 LTSSM Fault Up"


def explain(capsys, *args, stdin=None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main(["explain", *args])
    return code, capsys.readouterr().out


def test_a_code_prints_meaning_severity_nvidias_action_and_ours(capsys):
    code, out = explain(capsys, "79")
    assert code == 0
    assert "GPU has fallen off the bus" in out and "critical: pages" in out
    assert "RESTART_BM" in out and "drain and reboot" in out and "hardware:     yes" in out


def test_a_deviation_is_shown_with_its_reason_and_source(capsys):
    _, out = explain(capsys, "109")
    assert "info: stored, no incident" in out and "NVIDIA:       RESET_GPU" in out
    assert "deviation:" in out and "Kokolis" in out and "154" in out


def test_a_kernel_line_shows_what_it_parses_to(capsys):
    code, out = explain(capsys, "--year", "2025", LINE_48)
    assert code == 0
    assert "XID 48, on gpu-node7, GPU 0000:3b:00, at 2025-06-12T10:00:01.000Z, pid 1234 (python)" in out
    assert "Double Bit ECC Error" in out and "WORKFLOW_XID_48 -> RESET_GPU (solo)" in out


def test_lines_on_stdin_share_the_gpus_context(capsys, monkeypatch):
    code, out = explain(
        capsys, "--json", "--year", "2025", stdin=f"{LINE_48}\n\n{LINE_63}\n", monkeypatch=monkeypatch
    )
    assert code == 0
    first, second = json.loads(out)
    assert (first["code"], second["code"]) == (48, 63)
    assert second["context"] == [48] and second["category"] == "memory" and second["severity"] == "critical"
    assert "DRAIN_AND_RESET" in second["nvidia_action"]


def test_an_sxid_line_uses_the_nvswitch_catalog(capsys):
    _, out = explain(capsys, "--json", "--year", "2025", SXID)
    [result] = json.loads(out)
    assert (
        result["kind"] == "sxid" and result["device"] == "nvswitch" and result["pci_bus_id"] == "0000:c2:00"
    )
    assert result["severity"] == "critical" and result["incident_kind"] == "nvswitch_fatal"


def test_sxid_numbers_with_the_flag(capsys):
    _, out = explain(capsys, "--sxid", "11012")
    assert "Single bit ECC error" in out and "info" in out


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("hello world", "no 'NVRM: Xid'"),
        ("Jun 12 10:00:01 host kernel: NVRM: Xid (PCI:0000:3b", "does not parse"),
    ],
)
def test_a_line_that_does_not_parse_says_so_and_exits_1(capsys, line, reason):
    code, out = explain(capsys, "--year", "2025", line)
    assert code == 1
    assert "this line does not parse" in out and reason in out
    assert "Traceback" not in out


def test_an_unknown_code_is_flagged(capsys):
    _, out = explain(capsys, "4242")
    assert "not in NVIDIA's catalog" in out and "unknown" in out


def test_the_verdict_names_an_owners_job_storm_or_a_crash_loop_that_follows_them():
    from stream.cli.explain import _text, explain_items
    from stream.inputs.parsers.options import ParseOptions

    [result] = explain_items(["13"], ParseOptions(year=2024))
    job = {"job_id": "7", "user": "dbg", "name": "train", "num_nodes": 1, "gpus": 8,
           "start": "2024-01-01T00:00:00.000Z", "state": "RUNNING", "end": None}  # fmt: skip
    storm = {
        "incident_id": "inc-1",
        "kind": "job_xid_storm",
        "owner": "dbg",
        "summary": "[warn] XID storm from one job",
    }
    text = _text({**result, "jobs": [job], "owner_incidents": [storm]})
    assert "a storm of user dbg's job: the job's, not the node's" in text and "inc-1 to user dbg" in text
    loop = {**storm, "kind": "job_app_errors", "summary": "[warn] Application errors follow user dbg's jobs"}
    assert "the errors follow user dbg: not the node's" in _text(
        {**result, "jobs": [job], "owner_incidents": [loop]}
    )
