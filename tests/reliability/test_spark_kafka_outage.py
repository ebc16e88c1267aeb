"""Kafka away under the running Spark joiner for longer than its sink's bounds (the transaction timeout and the
start-up deadline, shortened here), in brief and seeded, in `make reliability` beside the run that stops Kafka for
6 minutes under the default bounds (`make test` has the sink's own path: `test_spark_sink_outage`).

The joiner used to stop for good after such an outage: its sink made a new producer inside the failed batch, on
Py4J's callback thread, and the start-up deadline's `SystemExit` ended that thread alone. Now the query fails and
is restarted, the process exits once Kafka stays away past the start-up deadline and supervision starts it again,
and it resumes by itself once Kafka is back: `machine.out` equals the offline join, nothing twice, and no
record is counted lost. Meanwhile `make status` calls it stuck, waiting for Kafka. (Which of these paths a run
takes depends on where the outage meets the job: `test_spark_sink_outage` takes the sink's every time.)"""
from __future__ import annotations

import re

import pytest

from chaos_support import ChaosPlan, Fault, chaos_workdir, run_chaos

pytestmark = [pytest.mark.slow, pytest.mark.integration]

STARTUP_DEADLINE_S = 15
TRANSACTION_TIMEOUT_S = 10
KAFKA_AWAY_S = 45  # past both bounds, and past the two of them in a row


def test_a_kafka_outage_past_the_sink_s_bounds_the_spark_joiner_resumes_exactly(monkeypatch) -> None:
    monkeypatch.setenv("KAFKA_STARTUP_DEADLINE_S", str(STARTUP_DEADLINE_S))
    monkeypatch.setenv("SPARK_JOINER_KAFKA_TRANSACTION_TIMEOUT_S", str(TRANSACTION_TIMEOUT_S))
    monkeypatch.setenv("PROGRESS_INTERVAL_S", "2")
    plan = ChaosPlan(joiner="spark", rows=1_200, machines=10, rate=40.0, bad_rows=6)  # a 30 s replay
    faults = [Fault(10, "stop", "kafka"), Fault(10, "await-stuck", "spark-joiner"),
              Fault(10 + KAFKA_AWAY_S, "start", "kafka")]
    report = run_chaos(plan, chaos_workdir("spark-kafka-outage"), faults=faults)
    print(report.summary())
    [verdict] = report.verdicts
    assert "waiting for Kafka" in verdict.line, verdict.line
    # Nothing was lost, so nothing may be counted lost: a restarted query's first batch, whose progress update
    # never came, once showed as records skipped.
    skipped = re.findall(r"records skipped (\d[\d,]*)", report.joiner_log)
    assert skipped and skipped[-1].rstrip(",") == "0", skipped[-3:]
