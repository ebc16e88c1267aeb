"""The DB connector waits for a commit's answer while it serves its group and reports its progress.

A synchronous commit did neither: with the group coordinator's host cut off (the storm across hosts) it blocked the
connector for 49 s, reporting nothing, and a rebalance meanwhile waited for this member to rejoin while the other
one held no partitions. Here the broker is frozen (SIGSTOP) while a written batch waits to be committed: its
progress reports go on every interval through the wait, and once the broker thaws, every point is stored: by the
same connector or, where librdkafka left its consumer outside the group (seen once in two runs under load), by the
one started again after it ended itself as wedged (`pipeline_core.group_watch`).

The test freezes Kafka, so it runs a broker of its own (`private_kafka`).
"""
from __future__ import annotations

import subprocess
import sys
import time
from datetime import datetime
from typing import Any

import pytest

from conftest import EVENTS_FILE
from db_connector_support import (connectors, database,  # noqa: F401 (fixtures)
                                  expected_raw_points, key_of, one_batch_waiting, raw_records, wait_for_points)
from fault_support import frozen
from pipeline_core import paths
from pipeline_core.group_watch import WEDGED_CONSUMER_EXIT_CODE
from support import produce_records, wait_for

pytestmark = pytest.mark.integration

FLUSH_INTERVAL_S = 8
PROGRESS_INTERVAL_S = 1
# Longer than the freeze: the member keeps its partitions, so the wait ends with the commit's answer.
SESSION_TIMEOUT_MS = 60_000
# Progress reports the connector makes while the commit waits (one per PROGRESS_INTERVAL_S): a synchronous commit
# blocked the loop, and made none.
REPORTS_WHILE_COMMITTING = 5


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
    raw: list[dict[str, Any]] = raw_records(EVENTS_FILE)
    half = len(raw) // 2
    # One batch for the whole first half, written FLUSH_INTERVAL_S after its first record: the broker is frozen by
    # then, so the commit after the write waits for it.
    topics, connector = one_batch_waiting(bootstrap, "commit-wait", name, connectors, raw[:half], FLUSH_INTERVAL_S,
                                          SESSION_TIMEOUT_MS, PROGRESS_INTERVAL_S)

    # Frozen for the block, confirmed (state T) at its start and still at its end: else the test proved nothing.
    with frozen(_kafka_pid(), "Kafka"):
        # The batch stored: its commit is asked of the frozen coordinator, which answers nothing.
        wait_for_points(client, raw=expected_raw_points(raw[:half]), deadline_s=60)
        written_at = time.time()

        def reports_since_written() -> int:
            return sum(t > written_at for t in _report_times(connector.log()))

        wait_for(lambda: reports_since_written() >= REPORTS_WHILE_COMMITTING, REPORTS_WHILE_COMMITTING * 4,
                 f"{REPORTS_WHILE_COMMITTING} progress reports while the commit waits", interval_s=0.5)

    produce_records(bootstrap, topics.data, raw[half:], key=key_of)
    # As supervision does: a connector that ended itself with its consumer wedged (librdkafka once left it outside
    # its group after this freeze, `pipeline_core.group_watch`) is started again, and its batch is read again.
    wedged_exits = 0
    deadline = time.monotonic() + 240
    while True:
        if connector.process is not None and connector.process.poll() == WEDGED_CONSUMER_EXIT_CODE:
            wedged_exits += 1
            connector.start()
        try:
            wait_for_points(client, raw=expected_raw_points(raw), deadline_s=5)
            break
        except AssertionError as error:
            exited_otherwise = not connector.alive() and connector.process.poll() != WEDGED_CONSUMER_EXIT_CODE
            if exited_otherwise or time.monotonic() > deadline:
                raise AssertionError(f"{error}\nthe connector's log:\n{connector.log()}") from None
    assert connector.alive(), connector.log()
    assert wedged_exits == connector.log().count("ending the process"), connector.log()
