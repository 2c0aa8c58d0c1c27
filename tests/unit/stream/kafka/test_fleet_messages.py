"""The fleet topic's messages carry what job-aware verdicts need, and read those of older workers."""

from __future__ import annotations

import orjson
import pytest

from detectors.attribution import HardwareEvent
from detectors.fleet import APP_XID, RUN, FleetFact, JobPart
from schemas.outputs import IncidentKind
from schemas.records import JobState
from stream.kafka.fleet import (
    ForeignDeployment,
    check_deployment,
    decode_baselines,
    decode_fleet_message,
    decode_references,
    encode_baselines,
    encode_fleet_messages,
)
from stream.settings import Settings


def part(**fields: object) -> JobPart:
    base: dict[str, object] = {
        "cluster": "c", "job_id": "7", "start_ms": 0, "end_ms": 60_000, "state": JobState.FAILED,
        "nodes": ("n1", "n2"), "gpus": 16, "covered": ("n1",),
        "evidence": (HardwareEvent(50_000, "n1", "0000:07:00", IncidentKind.GPU_BUS, 79),),
    }  # fmt: skip
    base.update(fields)
    return JobPart(**base)  # type: ignore[arg-type]


def test_facts_and_parts_round_trip_with_the_owner_and_the_application_xids() -> None:
    facts = [FleetFact(1, RUN, "n1", "dbg", "7", 1), FleetFact(2, APP_XID, "n1", "dbg", "7", 13)]
    jobs = [part(user="dbg", app_xids=3, name="debug", partition="dev")]
    [message] = [decode_fleet_message(m) for m in encode_fleet_messages(0, 5, facts, jobs)]
    assert message.facts == facts and message.jobs == jobs and message.horizon_ms == 5


def test_a_part_from_a_worker_before_job_aware_verdicts_has_no_owner() -> None:
    [raw] = encode_fleet_messages(0, 5, [], [part()])
    doc = orjson.loads(raw)
    for job in doc["jobs"]:
        del job["user"], job["app_xids"], job["name"], job["partition"]
    [job] = decode_fleet_message(orjson.dumps(doc)).jobs
    assert (job.user, job.app_xids, job.name, job.partition) == ("", 0, "", "")
    assert job.evidence == part().evidence


def test_baselines_carry_the_ecc_references_and_an_older_stages_have_none() -> None:
    new = encode_baselines({0: 12.0}, {3_600_000: 96.5, 7_200_000: -1.0})
    old = orjson.dumps({"baselines": {"86400000": 10.0}})
    assert decode_references([new, old]) == ({0: 12.0, 86_400_000: 10.0}, {3_600_000: 96.5, 7_200_000: -1.0})
    assert decode_baselines([old]) == {86_400_000: 10.0}


def test_internal_messages_name_their_deployment_and_another_ones_are_refused() -> None:
    [raw] = encode_fleet_messages(3, 5, [], [], app="prod")
    message = decode_fleet_message(raw)
    assert message.app == "prod"
    check_deployment(message.app, "prod", "fleet offset 0")
    with pytest.raises(ForeignDeployment, match="written by deployment 'prod', not 'canary'"):
        check_deployment(message.app, "canary", "fleet offset 0")
    baselines = encode_baselines({0: 1.0}, app="prod")
    assert decode_references([baselines], "prod") == ({0: 1.0}, {})
    with pytest.raises(ForeignDeployment):
        decode_references([baselines], "canary")
    old = orjson.dumps({"baselines": {"0": 2.0}})  # a version that named no deployment: accepted
    assert decode_references([old], "canary") == ({0: 2.0}, {})


def test_internal_topics_are_named_from_the_app_id_unless_set() -> None:
    default = Settings()
    assert (default.topic_fleet, default.topic_checkpoints) == (
        "faultstream.fleet",
        "faultstream.checkpoints",
    )
    canary = Settings.from_env(
        {"FAULTSTREAM_WORKER_APP_ID": "canary", "FAULTSTREAM_TOPIC_FLEET": "shared.fleet"}
    )
    assert canary.topic_jobs_by_node == "canary.jobs-by-node" and canary.topic_fleet == "shared.fleet"
    renamed = default.with_overrides(worker_app_id="blue")
    assert renamed.topic_fleet_baselines == "blue.fleet-baselines"
    assert canary.with_overrides(worker_app_id="green").topic_fleet == "shared.fleet"  # set: kept
