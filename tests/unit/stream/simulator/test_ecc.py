"""The ECC counters the DCGM scrapes show."""

from __future__ import annotations

import itertools

from stream.simulator.config import SimulationConfig
from stream.simulator.ecc import iter_ecc_scrapes
from stream.simulator.history import run_model


def test_ecc_counters_follow_faults_and_reboots() -> None:
    config = SimulationConfig(nodes=30, days=6, seed=5, ecc_interval_minutes=60, hardware_failure_rate=120)
    history = run_model(config)
    scrapes = list(iter_ecc_scrapes(history.config, history.ecc))
    assert [scrape.ts_ms for scrape in scrapes] == list(history.ecc.scrape_ms)
    assert len(scrapes) == config.scrape_count
    dbe_faults = [fault for fault in history.faults if fault.xids[0] in (48, 94, 95)]
    assert dbe_faults
    gpn = config.gpus_per_node
    for fault in dbe_faults:
        after = next(k for k, scrape in enumerate(scrapes) if scrape.ts_ms >= fault.onset_ms)
        flat = fault.node * gpn + fault.gpu
        assert scrapes[after].dbe_aggregate[flat] > scrapes[after - 1].dbe_aggregate[flat]
    for before, after_scrape in itertools.pairwise(scrapes):
        assert (after_scrape.dbe_aggregate >= before.dbe_aggregate).all()
    assert scrapes[-1].sbe_volatile.sum() > 0
