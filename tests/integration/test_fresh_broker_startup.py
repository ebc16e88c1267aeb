"""The stages' Kafka start-up against a broker whose storage was formatted moments ago: it answers metadata,
but has neither __consumer_offsets nor __transaction_state yet, and answers coordinator requests with
NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE while it creates them. Every start-up call must wait that out.

Runs a Kafka of its own (`fresh_kafka`: a broker just formatted, on ports and a state folder of its own), and its
test of a topic that never comes the test process's own (`private_kafka`): the shared stack is never touched."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from kafka_joiner.service import KafkaJoiner
from kafka_joiner.settings import KafkaJoinerSettings
from pipeline_core.kafka_clients import (KafkaStartupError, admin_client, consumer_config,
                                         raise_partition_errors, retry_transient)
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, MACHINE_OUT, ensure_topics, partition_count
from spark_joiner.sink import TransactionalBatchSink
from support import unique

pytestmark = pytest.mark.integration


def test_every_start_up_call_waits_out_a_just_formatted_broker(fresh_kafka: str, tmp_path: Path) -> None:
    bootstrap = fresh_kafka
    admin = admin_client(bootstrap)
    # The first transactional producer and the first offset read of the broker's life: what failed the
    # Spark joiner's start from nothing every time.
    sink = TransactionalBatchSink(bootstrap, MACHINE_OUT.name, MACHINE_DLQ.name, unique("spark-joiner"),
                                  startup_deadline_s=120)
    try:
        assert sink.resume(MACHINE_DATA.name, str(tmp_path / "checkpoint")) == {}  # a new group: nothing committed
    finally:
        sink.close()

    joiner = KafkaJoiner(KafkaJoinerSettings(kafka_bootstrap_servers=bootstrap, instance_id=unique("lsb"),
                                             group_id=unique("joiner"), input_partitioned_by_thing=True,
                                             health_metrics=False))
    joiner.start()
    joiner.close()

    # A topic created now is asked for until its metadata has it: the connector's and joiner's partition count.
    created = unique("machine.data")
    ensure_topics(admin, (dataclasses.replace(MACHINE_DATA, name=created),), deadline_s=60)
    assert partition_count(admin, created, deadline_s=60) == 5

    group = Consumer(consumer_config(bootstrap, unique("fresh-group")))
    try:
        committed = retry_transient(
            lambda: raise_partition_errors(group.committed([TopicPartition(created, 0)], timeout=10)),
            what="reading a new group's offsets", deadline_s=60)
        assert committed[0].offset < 0  # nothing committed yet
    finally:
        group.close()


def test_a_topic_that_never_comes_ends_the_start_with_what_to_do(private_kafka: str) -> None:
    with pytest.raises(KafkaStartupError) as raised:
        partition_count(admin_client(private_kafka), "machine.data.missing", deadline_s=2)
    assert "reading the partitions of topic machine.data.missing" in str(raised.value)
    assert "UNKNOWN_TOPIC_OR_PART" in str(raised.value) and "python -m stack topics" in str(raised.value)
