"""The lag of partitions a consumer delivered nothing of (`pipeline_core.consumer_lag`), against a real broker.

What makes it a health signal: a consumer that fetches moves its position past whatever lies between the
committed offset and the end (records, a transaction's marker, aborted records), while one that does not fetch
keeps that lag. A DB connector or joiner whose partitions librdkafka left paused (it keeps a pause through a
revocation) was healthy by its heartbeat, its lag unknown or stopped; with the broker asked it is named stuck."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from conftest import EVENTS_FILE
from db_connector.connector import DbConnector
from db_connector.influx_sink import InfluxSink
from db_connector.settings import DbConnectorSettings
from db_connector_support import (connector_args, database, distinct_series_times,  # noqa: F401 (fixtures)
                                  key_of, raw_records, wait_for_count)
from kafka_joiner.service import KafkaJoiner
from kafka_joiner.settings import KafkaJoinerSettings
from kafka_joiner_support import as_multiset, offline_join, read_outputs, rows_as_records
from kafka_joiner_support import key_of as joiner_key_of
from pipeline_core.broker_offsets import BrokerOffsets
from pipeline_core.consumer_lag import unfetched_lag
from pipeline_core.kafka_clients import consumer_config, producer_config, transactional_producer_config
from pipeline_core.settings import load_settings
from pipeline_core.stage_health import assess, read_heartbeat
from support import produce_records, unique, wait_for

pytestmark = pytest.mark.integration

TIMEOUT_S = 10.0


def _fill(bootstrap: str, topic: str) -> dict[int, int]:
    """Partition 0: five records in a committed transaction (end 6, its marker included); 1: three aborted
    records (end 4); 2: four plain records; 3 and 4 stay empty. Returns the ends."""
    producer = Producer(transactional_producer_config(bootstrap, unique("lag-probe")))
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    for _ in range(5):
        producer.produce(topic, b"committed", partition=0)
    producer.commit_transaction(TIMEOUT_S)
    producer.begin_transaction()
    for _ in range(3):
        producer.produce(topic, b"aborted", partition=1)
    producer.flush(TIMEOUT_S)  # sent, so aborted in the log rather than purged from the queue
    producer.abort_transaction(TIMEOUT_S)
    plain = Producer(producer_config(bootstrap))
    for _ in range(4):
        plain.produce(topic, b"plain", partition=2)
    assert plain.flush(TIMEOUT_S) == 0
    return {0: 6, 1: 4, 2: 4, 3: 0, 4: 0}


def test_lag_not_fetched_is_between_the_committed_offset_and_the_end_and_fetching_leaves_none(
        bootstrap: str, new_topics) -> None:
    topic = new_topics().data
    ends = _fill(bootstrap, topic)
    group = unique("lag-group")
    partitions = [TopicPartition(topic, partition) for partition in ends]
    offsets = BrokerOffsets(bootstrap, TIMEOUT_S)
    committer = Consumer(consumer_config(bootstrap, group))
    committer.commit(offsets=[TopicPartition(topic, 0, 2)], asynchronous=False)
    committer.close()

    # Never fetched: paused from its assignment on. From the committed offset 2 in partition 0, from the
    # earliest offset in the others.
    paused = Consumer(consumer_config(bootstrap, group))
    try:
        paused.assign(partitions)
        paused.pause(partitions)
        paused.poll(1.0)
        assert all(position.offset < 0 for position in paused.position(partitions))
        assert unfetched_lag(paused, partitions, offsets) == (6 - 2) + 4 + 4
    finally:
        paused.close()

    # Fetching: every partition with anything past its start gets a position at its end, aborted records and
    # markers skipped; what stays without a position has no lag.
    fetching = Consumer(consumer_config(bootstrap, group))
    try:
        fetching.assign(partitions)

        def at_ends() -> list[TopicPartition] | None:
            fetching.poll(0.2)
            positions = fetching.position(partitions)
            moved = {p.partition: p.offset for p in positions if p.offset >= 0}
            return positions if moved == {0: 6, 1: 4, 2: 4} else None

        positions = wait_for(at_ends, 30, "the fetching consumer's positions at the partitions' ends")
        unread = [p for p in positions if p.offset < 0]
        assert [p.partition for p in unread] == [3, 4]
        assert unfetched_lag(fetching, unread, offsets) == 0
    finally:
        fetching.close()


@pytest.fixture
def raw() -> list[dict[str, Any]]:
    return raw_records(EVENTS_FILE)[:500]


@pytest.fixture
def running_connector(bootstrap: str, new_topics, database, tmp_path: Path) -> Iterator[tuple[DbConnector, Any]]:
    topics = new_topics()
    name, _client = database
    settings = load_settings(DbConnectorSettings, connector_args(
        topics, name, None, "--kafka-bootstrap-servers", bootstrap, "--progress-interval-s", "1",
        "--progress-file", str(tmp_path / "heartbeat.json"), "--no-health-metrics"))
    connector = DbConnector(settings, InfluxSink.from_settings(settings))
    thread = threading.Thread(target=connector.run, name="db-connector")
    thread.start()
    try:
        yield connector, topics
    finally:
        connector.stop.set()
        thread.join(60)
    assert not thread.is_alive()


def _verdict(heartbeat_file: Path, states: set[str]) -> Any:
    health = assess(read_heartbeat(heartbeat_file), time.time())
    return health if health.state in states else None


def test_a_db_connector_that_does_not_fetch_its_partitions_is_named_stuck(
        bootstrap: str, running_connector, database, raw, tmp_path: Path) -> None:
    connector, topics = running_connector
    _name, client = database
    # The state the connector was once left in: partitions assigned and paused inside librdkafka.
    consumer = connector._consumer  # noqa: SLF001 - the test plays librdkafka's part
    assignment = wait_for(lambda: consumer.assignment() or None, 60, "the connector's assignment")
    consumer.pause(assignment)
    produce_records(bootstrap, topics.data, raw, key=key_of)
    heartbeat_file = tmp_path / "heartbeat.json"

    stuck = wait_for(lambda: _verdict(heartbeat_file, {"stuck"}), 60, "the heartbeat to say stuck", interval_s=0.2)
    assert stuck.lag == len(raw) and f"{len(raw):,} records waiting" in stuck.detail, stuck

    consumer.resume(assignment)
    wait_for_count(client, "machinedata", distinct_series_times(raw))
    wait_for(lambda: _verdict(heartbeat_file, {"idle"}), 60, "the heartbeat to say idle once everything is written",
             interval_s=0.2)


def test_a_joiner_that_does_not_fetch_its_input_is_named_stuck(bootstrap: str, new_topics, tmp_path: Path) -> None:
    topics = new_topics()
    heartbeat_file = tmp_path / "heartbeat.json"
    joiner = KafkaJoiner(KafkaJoinerSettings(
        kafka_bootstrap_servers=bootstrap, input_topic=topics.data, output_topic=topics.out, dlq_topic=topics.dlq,
        group_id=unique("lag-joiner"), transactional_id_prefix=unique("lag-joiner"), instance_id="lag",
        input_partitioned_by_thing=True, progress_interval_s=1.0, progress_file=heartbeat_file,
        health_metrics=False))
    joiner.start()
    runner = threading.Thread(target=joiner.run, name="joiner")
    runner.start()
    try:
        consumer = joiner._consumer  # noqa: SLF001 - the test plays librdkafka's part
        assignment = wait_for(lambda: joiner.assigned() and consumer.assignment() or None, 60,
                              "the joiner's assignment")
        consumer.pause(assignment)
        records = rows_as_records(EVENTS_FILE, time_order=True)[:3000]
        produce_records(bootstrap, topics.data, records, key=joiner_key_of, by_thing=True)

        stuck = wait_for(lambda: _verdict(heartbeat_file, {"stuck"}), 60, "the heartbeat to say stuck",
                         interval_s=0.2)
        assert stuck.lag == len(records), stuck

        consumer.resume(assignment)
        expected, _ = offline_join(records)
        outputs = read_outputs(bootstrap, topics.out, len(expected))
        assert as_multiset([m.value for m in outputs]) == as_multiset(expected)
        wait_for(lambda: _verdict(heartbeat_file, {"progressing", "idle"}), 60, "the joiner healthy again",
                 interval_s=0.2)
    finally:
        joiner.stop.set()
        runner.join(60)
    assert not runner.is_alive()
