"""Kafka away while the DB connector waits to commit a written batch, long enough for its group session to time out.

While a write or a commit waits, the connector pauses fetching and keeps serving the group. Here the session
times out during that wait: librdkafka revokes the partitions, the connector drops its commit (the records are
read again) and resumes fetching, on no partition at all; once Kafka is back the group gives the same partitions
back. librdkafka keeps a partition's pause through its revocation, so those came back paused and the connector
never fetched again, healthy by its heartbeat (no lag known): seen in the cluster's short chaos run with a Kafka
node killed. The connector now sets every assignment's pause to its own state.

The test stops and starts Kafka, so it runs a broker of its own (`private_kafka`).
"""
from __future__ import annotations

from typing import Any

import pytest

from conftest import EVENTS_FILE
from db_connector_support import (connectors, database,  # noqa: F401 (fixtures)
                                  expected_raw_points, key_of, one_batch_waiting, raw_records, wait_for_points)
from fault_support import stop_server
from stack import manager
from stack.services import Kafka
from support import produce_records, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration]

FLUSH_INTERVAL_S = 8
SESSION_TIMEOUT_MS = 12_000


def test_partitions_given_back_after_a_session_timeout_in_a_commit_wait_are_fetched_again(
        private_kafka: str, database, connectors) -> None:
    bootstrap = private_kafka
    name, client = database
    raw: list[dict[str, Any]] = raw_records(EVENTS_FILE)
    half = len(raw) // 2
    # One batch for the whole first half, written FLUSH_INTERVAL_S after its first record: Kafka is stopped by
    # then, so the commit that follows the write waits for it, fetching paused, until the session times out.
    topics, connector = one_batch_waiting(bootstrap, "rebalance", name, connectors, raw[:half], FLUSH_INTERVAL_S,
                                          SESSION_TIMEOUT_MS)
    stop_server(Kafka(), bootstrap, "Kafka")
    wait_for(lambda: "committing offsets" in connector.log(), 60, "the commit waiting for Kafka")
    wait_for(lambda: "revoked" in connector.log(), 60, "the session timing out during the commit's wait")
    assert "kafka" in manager.up([Kafka()])
    wait_for(lambda: connector.log().count("assigned ") >= 2, 120, "the partitions given back")

    produce_records(bootstrap, topics.data, raw[half:], key=key_of)
    wait_for_points(client, raw=expected_raw_points(raw), deadline_s=120)
    assert connector.alive(), connector.log()
