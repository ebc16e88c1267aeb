"""Partitions' offsets from the broker (`pipeline_core.broker_offsets`) across a broker restart.

After a restart the partitions' leader epochs move on. An admin client that kept its metadata asked with the old
epochs, and the broker answered FENCED_LEADER_EPOCH at every report from then on: seen as a Spark joiner's lag
unknown for good after one of the cluster's Kafka nodes was killed and restarted.

The test stops and starts Kafka, so it runs a broker of its own (`private_kafka`)."""
from __future__ import annotations

import dataclasses

import pytest

from conftest import EVENTS_FILE
from fault_support import stop_server
from kafka_joiner_support import key_of, rows_as_records
from pipeline_core.broker_offsets import BrokerOffsets
from pipeline_core.kafka_clients import admin_client
from pipeline_core.topics import MACHINE_DATA, ensure_topics
from stack import manager
from stack.services import Kafka
from support import produce_records, wait_for

pytestmark = pytest.mark.integration


def test_the_offsets_come_again_after_the_broker_restarted(private_kafka: str) -> None:
    bootstrap = private_kafka
    topic = dataclasses.replace(MACHINE_DATA, name=f"{MACHINE_DATA.name}.restart")
    ensure_topics(admin_client(bootstrap), (topic,))
    records = rows_as_records(EVENTS_FILE, time_order=True)[:1000]
    produce_records(bootstrap, topic.name, records, key=key_of, by_thing=True)
    partitions = [(topic.name, partition) for partition in range(topic.partitions)]
    offsets = BrokerOffsets(bootstrap, timeout_s=2.0)
    latest = wait_for(lambda: offsets.latest(partitions), 60, "the latest offsets", interval_s=0.5)
    assert sum(latest.values()) == len(records)

    stop_server(Kafka(), bootstrap, "Kafka")
    assert offsets.latest(partitions) is None  # no broker: unknown, after the timeout
    assert "kafka" in manager.up([Kafka()])

    latest = wait_for(lambda: offsets.latest(partitions), 60, "the latest offsets after the restart", interval_s=0.5)
    assert sum(latest.values()) == len(records)
