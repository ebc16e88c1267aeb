"""The DB connector waits for a commit's answer while it serves its group and reports its progress.

A synchronous commit did neither: with the group coordinator's host cut off (the storm across hosts) it blocked the
connector for 49 s, reporting nothing, and a rebalance meanwhile waited for this member to rejoin while the other
one held no partitions. Here the broker is frozen (SIGSTOP) while a written batch waits to be committed: its
progress reports go on every interval through the wait, and once the broker thaws, every point is stored.

The test freezes Kafka, so it runs a broker of its own (`private_kafka`).
"""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from conftest import EVENTS_FILE
from db_connector_support import (connector_args, connectors, database,  # noqa: F401 (fixtures)
                                  expected_raw_points, key_of, raw_records, wait_for_points)
from pipeline_core.kafka_clients import admin_client
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, MACHINE_OUT, ensure_topics
from pipeline_core import paths
from support import produce_records, wait_for

pytestmark = pytest.mark.integration

FLUSH_INTERVAL_S = 8
PROGRESS_INTERVAL_S = 1
# Longer than the freeze: the member keeps its partitions, so the wait ends with the commit's answer.
SESSION_TIMEOUT_MS = 60_000
# Progress reports the connector makes while the commit waits (one per PROGRESS_INTERVAL_S): a synchronous commit
# blocked the loop, and made none.
REPORTS_WHILE_COMMITTING = 5


@dataclasses.dataclass(frozen=True)
class Topics:
    data: str
    out: str
    dlq: str


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _kafka_pid() -> int:
    config = paths.STATE_DIR / "supervisor" / "supervisord.conf"
    done = subprocess.run([sys.executable, "-m", "supervisor.supervisorctl", "-c", str(config), "pid", "kafka"],
                          capture_output=True, text=True, timeout=60, check=True)
    return int(done.stdout.strip())


def _report_times(log: str) -> list[float]:
    """The Unix times of the connector's progress lines."""
    return [datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            for line in log.splitlines() if "db_connector.connector: records in" in line]


def test_a_commit_waiting_for_a_frozen_broker_keeps_the_connector_reporting(
        private_kafka: str, database, connectors) -> None:
    bootstrap = private_kafka
    name, client = database
    topics = Topics(*(f"{spec.name}.commit-wait" for spec in (MACHINE_DATA, MACHINE_OUT, MACHINE_DLQ)))
    ensure_topics(admin_client(bootstrap), tuple(dataclasses.replace(spec, name=topic) for spec, topic in
                                                 ((MACHINE_DATA, topics.data), (MACHINE_OUT, topics.out),
                                                  (MACHINE_DLQ, topics.dlq))))
    raw: list[dict[str, Any]] = raw_records(EVENTS_FILE)
    half = len(raw) // 2
    produce_records(bootstrap, topics.data, raw[:half], key=key_of)
    # One batch for the whole first half, written FLUSH_INTERVAL_S after its first record: the broker is frozen by
    # then, so the commit after the write waits for it.
    connector = connectors(connector_args(
        topics, name, None, "--kafka-bootstrap-servers", bootstrap, "--batch-size", "1000000",
        "--flush-interval-s", str(FLUSH_INTERVAL_S), "--session-timeout-ms", str(SESSION_TIMEOUT_MS),
        "--retry-max-s", "1", "--progress-interval-s", str(PROGRESS_INTERVAL_S)))
    wait_for(lambda: f"records in {half:,}" in connector.log(), 30, "the first half consumed, in one batch")
    assert "committing offsets" not in connector.log()  # the batch waits for its flush: the freeze goes first

    pid = _kafka_pid()
    os.killpg(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: _state(pid) == "T", 10, "Kafka frozen")
        # The batch stored: its commit is asked of the frozen coordinator, which answers nothing.
        wait_for_points(client, raw=expected_raw_points(raw[:half]), deadline_s=60)
        written_at = time.time()

        def reports_since_written() -> int:
            return sum(t > written_at for t in _report_times(connector.log()))

        wait_for(lambda: reports_since_written() >= REPORTS_WHILE_COMMITTING, REPORTS_WHILE_COMMITTING * 4,
                 f"{REPORTS_WHILE_COMMITTING} progress reports while the commit waits", interval_s=0.5)
        assert _state(pid) == "T", "Kafka thawed before the reports were seen: the test proved nothing"
    finally:
        os.killpg(pid, signal.SIGCONT)

    produce_records(bootstrap, topics.data, raw[half:], key=key_of)
    wait_for_points(client, raw=expected_raw_points(raw), deadline_s=120)
    assert connector.alive(), connector.log()
