"""Outages of minutes while a replay runs: nothing is lost, nothing doubled, nothing good dead-lettered.

Kafka is stopped for 6 minutes (past the producers' 5-minute delivery timeout and every other default),
then InfluxDB for 2 minutes, and Mosquitto is restarted. Afterwards machine.data, machine.out
(read_committed) and InfluxDB hold exactly what a fault-free run gives, and machine.dlq only the bad rows.
"""
from __future__ import annotations

import pytest

from chaos_support import ChaosPlan, chaos_workdir, Fault, run_chaos

pytestmark = [pytest.mark.slow, pytest.mark.integration]

OUTAGES = [
    Fault(30, "stop", "kafka"), Fault(390, "start", "kafka"),
    Fault(420, "stop", "influxdb"), Fault(540, "start", "influxdb"),
    Fault(570, "restart", "mosquitto"),
]


@pytest.mark.parametrize("joiner", ["spark", "lsb"])
def test_outages_of_minutes_lose_nothing_and_dead_letter_nothing_good(joiner):
    plan = ChaosPlan(joiner=joiner, rows=12_000, machines=20, rate=20.0, bad_rows=10)  # a 10-minute replay
    report = run_chaos(plan, chaos_workdir(f"outages-{joiner}"), faults=OUTAGES)
    print(report.summary())
