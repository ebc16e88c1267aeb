"""Loss outside the pipeline's control is loud: records deleted before a stage read them and a topic deleted
under a running stage are logged as warnings and counted in the stage's health metrics, with exact counts,
and the stage goes on (reading a recreated topic from its start)."""
from __future__ import annotations

import re

import pytest
from confluent_kafka import Consumer, TopicPartition
from influxdb import InfluxDBClient

from data_loss_support import committed_offsets, delete_records_before, logged_total, produce, records, recreate
from db_connector_support import (PrivateInfluxDB, connector_args, connectors, database,  # noqa: F401 (fixtures)
                                  wait_for_count)
from kafka_joiner_support import JoinerProcess, joiners  # noqa: F401 (a fixture)
from pipeline_core.kafka_clients import consumer_config
from pipeline_core.topics import MACHINE_DATA, TopicSpec
from stack.losses import stage_losses
from support import unique, wait_for

pytestmark = pytest.mark.integration




def health_total(client: InfluxDBClient, field: str) -> int | None:
    points = list(client.query(f'SELECT last("{field}") FROM "health"."pipeline_health" WHERE "stage" = \'db_connector\' '
                               "AND time > now() - 1h").get_points())
    return int(points[0]["last"]) if points else None


def test_records_deleted_before_the_db_connector_read_them_are_counted(bootstrap, new_topics, database, connectors):
    topics = new_topics()
    name, client = database
    args = connector_args(topics, name, unique("db-connector-loss"))
    first = records(0, 300)
    produce(bootstrap, topics.data, first)
    stopped = connectors(args, "first")
    wait_for_count(client, "machinedata", len(first))
    assert stopped.terminate() == 0  # commits what it wrote

    # While it is down, 700 more arrive and retention deletes the first 40 of them in every partition.
    second = records(300, 700)
    ends = produce(bootstrap, topics.data, second)
    from_offsets = wait_for(lambda: committed_offsets(bootstrap, topics.data, args), 10, "the committed offsets")
    deleted_to = {partition: min(from_offsets.get(partition, 0) + 40, end) for partition, end in ends.items()}
    delete_records_before(bootstrap, topics.data, deleted_to)
    deleted = sum(deleted_to[partition] - from_offsets.get(partition, 0) for partition in deleted_to)
    assert deleted > 0

    connector = connectors(args, "second")
    wait_for_count(client, "machinedata", len(first) + len(second) - deleted)
    wait_for(lambda: health_total(client, "records_skipped") == deleted, 30,
             f"records_skipped = {deleted} in pipeline_health")
    assert health_total(client, "offset_resets") == len(deleted_to)
    # make status adds up the stage's processes: the first run lost nothing, the second all of it.
    assert stage_losses(client)["db_connector"]["records_skipped"] == deleted
    assert "were deleted by retention before this stage read them" in connector.log()
    assert re.search(r"WARNING .*deleted by retention", connector.log())


def test_records_deleted_while_the_running_db_connector_waits_for_influxdb_are_counted(bootstrap, new_topics,
                                                                                      connectors, tmp_path):
    """The stage falls behind retention while it runs: InfluxDB is away, the connector waits with its partitions
    paused, and retention deletes records it has not fetched yet."""
    topics = new_topics()
    influxd = PrivateInfluxDB(tmp_path / "influxd").start()
    try:
        client = influxd.client("machinedata")
        first = records(0, 200)
        produce(bootstrap, topics.data, first)
        connector = connectors(connector_args(topics, "machinedata", None, "--influxdb-port", str(influxd.port),
                                              "--retry-max-s", "1"))
        wait_for_count(client, "machinedata", len(first))

        influxd.stop()
        positions = produce(bootstrap, topics.data, records(200, 1))  # its write waits for InfluxDB
        wait_for(lambda: connector.log().count("retrying") >= 2, 60, "the connector waiting for InfluxDB")
        positions = {**wanted_ends(bootstrap, topics.data), **positions}
        ends = produce(bootstrap, topics.data, records(201, 300))
        deleted_to = {partition: max(positions[partition], end - 10) for partition, end in ends.items()}
        delete_records_before(bootstrap, topics.data, deleted_to)
        deleted = sum(deleted_to[partition] - positions[partition] for partition in deleted_to)
        assert deleted > 0

        influxd.start()
        wait_for_count(client, "machinedata", len(first) + 1 + 300 - deleted)
        wait_for(lambda: logged_total(connector.log(), "records skipped") == deleted, 30, f"{deleted} skipped")
        assert re.search(r"WARNING .*were deleted by retention before this stage read them", connector.log())
        assert connector.alive()
    finally:
        influxd.close()


def wanted_ends(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition's end offset now."""
    consumer = Consumer(consumer_config(bootstrap, unique("ends")))
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
    finally:
        consumer.close()


def test_a_partition_without_the_committed_offset_its_group_has_elsewhere_is_a_counted_reset(
        bootstrap, new_topics, database, connectors):
    """The group has offsets of every partition of the data topic but one (lost, or never committed), whose log
    no longer starts at 0: the reset to its earliest offset is counted with what lay below it."""
    topics = new_topics()
    name, client = database
    group = unique("db-connector-loss")
    ends = produce(bootstrap, topics.data, records(0, 500))
    lost, *kept = sorted(ends)
    delete_records_before(bootstrap, topics.data, {lost: 30})
    committer = Consumer(consumer_config(bootstrap, group))
    committer.commit(offsets=[TopicPartition(topics.data, partition, ends[partition]) for partition in kept],
                     asynchronous=False)
    committer.close()

    connector = connectors(connector_args(topics, name, group))
    wait_for_count(client, "machinedata", ends[lost] - 30)
    wait_for(lambda: health_total(client, "offset_resets") == 1, 30, "offset_resets = 1 in pipeline_health")
    assert health_total(client, "records_skipped") == 30
    assert re.search(rf"WARNING .*{re.escape(topics.data)} \[{lost}\] has no committed offset", connector.log())


def test_the_db_connector_counts_a_deleted_topic_and_reads_it_again_from_its_start(bootstrap, new_topics, database,
                                                                                   connectors):
    topics = new_topics()
    name, client = database
    first = records(0, 200)
    produce(bootstrap, topics.data, first)
    connector = connectors(connector_args(topics, name, unique("db-connector-loss")))
    wait_for_count(client, "machinedata", len(first))

    deleted_warning = rf"WARNING .*topic {re.escape(topics.data)} was deleted under this stage"
    recreate(bootstrap, TopicSpec(topics.data, MACHINE_DATA.partitions, dict(MACHINE_DATA.config)),
             lambda: re.search(deleted_warning, connector.log()))
    second = records(200, 150)
    produce(bootstrap, topics.data, second)
    wait_for_count(client, "machinedata", len(first) + len(second), deadline_s=60)
    wait_for(lambda: health_total(client, "topics_deleted") == 1, 30, "topics_deleted = 1 in pipeline_health")
    assert connector.alive()
    # The recreated topic has no committed offsets: read from its start, which is no reset and no loss.
    assert health_total(client, "offset_resets") == 0 and health_total(client, "records_skipped") == 0



def joiner_total(joiner: JoinerProcess, label: str) -> int:
    return logged_total(joiner.log(), label)


def test_the_standalone_joiner_counts_records_deleted_before_it_read_them(bootstrap, new_topics, joiners, tmp_path):
    topics = new_topics()
    group = unique("joiner-loss")
    first = records(0, 300)
    produce(bootstrap, topics.data, first)
    joiner = JoinerProcess(bootstrap, topics, group, tmp_path)
    joiners.append(joiner)
    joiner.start()
    wait_for(lambda: joiner_total(joiner, "records in") == len(first), 60, "the first records read")
    assert joiner.terminate() == 0

    ends = produce(bootstrap, topics.data, records(300, 700))
    from_offsets = wait_for(lambda: committed_offsets(bootstrap, topics.data, ["--group-id", group]), 10,
                            "the committed offsets")
    deleted_to = {partition: min(from_offsets.get(partition, 0) + 25, end) for partition, end in ends.items()}
    delete_records_before(bootstrap, topics.data, deleted_to)
    deleted = sum(deleted_to[partition] - from_offsets.get(partition, 0) for partition in deleted_to)

    joiner.start()
    wait_for(lambda: joiner_total(joiner, "records in") == 700 - deleted, 60, "the records left read")
    wait_for(lambda: joiner_total(joiner, "records skipped") == deleted, 30, f"{deleted} deleted unread")
    assert re.search(r"WARNING .*deleted by retention before this stage read them", joiner.log())
    assert joiner_total(joiner, "topics deleted") == 0


@pytest.mark.parametrize("noticed", [True, False], ids=["recreated-once-noticed", "recreated-at-once"])
def test_the_standalone_joiner_survives_its_input_topic_deleted_and_reads_it_again(bootstrap, new_topics, joiners,
                                                                                   tmp_path, noticed):
    topics = new_topics()
    first = records(0, 200)
    produce(bootstrap, topics.data, first)
    joiner = JoinerProcess(bootstrap, topics, unique("joiner-loss"), tmp_path)
    joiners.append(joiner)
    joiner.start()
    wait_for(lambda: joiner_total(joiner, "records in") == len(first), 60, "the first records read")

    # Created again at once, the joiner may not hear of the deletion, but sees the offsets going back.
    deleted_warning = rf"WARNING .*topic {re.escape(topics.data)} was deleted under this stage"
    recreate(bootstrap, TopicSpec(topics.data, MACHINE_DATA.partitions, dict(MACHINE_DATA.config)),
             (lambda: re.search(deleted_warning, joiner.log())) if noticed else lambda: True)
    produce(bootstrap, topics.data, records(200, 150))
    wait_for(lambda: joiner_total(joiner, "records in") == len(first) + 150, 60, "the recreated topic read")
    wait_for(lambda: joiner_total(joiner, "topics deleted") == 1, 30, "topics deleted 1")
    assert re.search(rf"WARNING .*{re.escape(topics.data)}.*(was deleted under this stage|went back)", joiner.log())
    assert joiner.alive()

