"""Loss outside the pipeline's control is loud: records deleted before a stage read them and a topic deleted
under a running stage are logged as warnings and counted in the stage's health metrics, with exact counts,
and the stage goes on (reading a recreated topic from its start)."""
from __future__ import annotations

import re
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from influxdb import InfluxDBClient

from db_connector_support import ConnectorProcess, connector_args, wait_for_count
from kafka_joiner_support import JoinerProcess, delete_internal_topics
from pipeline_core.kafka_clients import admin_client, consumer_config, producer_config
from pipeline_core.records import encode_record, record_key
from pipeline_core.settings import ConnectionSettings
from pipeline_core.topics import MACHINE_DATA, TopicSpec, ensure_topics
from stack.losses import stage_losses
from support import unique, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def database(stack: ConnectionSettings) -> Iterator[tuple[str, InfluxDBClient]]:
    name = unique("test_data_loss").replace(".", "_")
    client = InfluxDBClient(stack.influxdb_host, stack.influxdb_port, database=name, timeout=30)
    client.create_database(name)
    yield name, client
    client.drop_database(name)


@pytest.fixture
def connectors(tmp_path: Path) -> Iterator[Callable[..., ConnectorProcess]]:
    started: list[ConnectorProcess] = []

    def start(args: list[str], name: str = "connector") -> ConnectorProcess:
        process = ConnectorProcess(tmp_path / f"{name}.log", args)
        started.append(process)
        return process.start()

    yield start
    for process in started:
        process.kill()


def records(first: int, count_: int) -> list[dict[str, Any]]:
    """`count_` readings of distinct times (one InfluxDB point each), over a few things (so partitions)."""
    return [{"thing": f"machine-{index % 7}", "quantity": "speed", "phenomenonTime": 1_700_000_000_000 + index,
             "result": float(index)} for index in range(first, first + count_)]


def produce(bootstrap: str, topic: str, batch: list[dict[str, Any]]) -> dict[int, int]:
    """Produce and wait for every delivery; returns each partition's end offset after it."""
    producer = Producer(producer_config(bootstrap))
    ends: dict[int, int] = {}

    def delivered(error, message) -> None:
        assert error is None, error
        ends[message.partition()] = max(ends.get(message.partition(), 0), message.offset() + 1)

    for record in batch:
        producer.produce(topic, encode_record(record), record_key(record["thing"], record["quantity"]),
                         on_delivery=delivered)
    assert producer.flush(30) == 0
    return ends


def delete_records_before(bootstrap: str, topic: str, offsets: dict[int, int]) -> None:
    """What retention does, now: the records of each partition below its offset are gone."""
    admin = admin_client(bootstrap)  # kept while the futures are pending: they end with the client
    futures = admin.delete_records([TopicPartition(topic, partition, offset) for partition, offset in offsets.items()])
    for future in futures.values():
        future.result(30)


def health_total(client: InfluxDBClient, field: str) -> int | None:
    points = list(client.query(f'SELECT last("{field}") FROM "pipeline_health" WHERE "stage" = \'db_connector\' '
                               "AND time > now() - 1h").get_points())
    return int(points[0]["last"]) if points else None


def logged_total(log: str, label: str) -> int:
    """A counter's total in the last progress line that names it."""
    totals = re.findall(rf"{label} ([\d,]+)", log)
    return int(totals[-1].replace(",", "")) if totals else 0


def test_records_deleted_before_the_db_connector_read_them_are_counted(bootstrap, new_topics, database, connectors):
    topics = new_topics()
    name, client = database
    args = connector_args(topics, name, unique("db-connector-loss"))
    first = records(0, 300)
    produce(bootstrap, topics.data, first)
    stopped = connectors(args, "first")
    wait_for_count(client, "machinedata", len(first))
    assert stopped.kill(signal.SIGTERM) == 0  # commits what it wrote

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


def committed_offsets(bootstrap: str, topic: str, args: list[str]) -> dict[int, int] | None:
    group = args[args.index("--group-id") + 1]
    consumer = Consumer(consumer_config(bootstrap, group))
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        committed = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
    finally:
        consumer.close()
    offsets = {position.partition: position.offset for position in committed if position.offset >= 0}
    return offsets or None


def recreate(bootstrap: str, spec: TopicSpec, noticed: Callable[[], bool] = lambda: True) -> None:
    """Delete the topic, wait until `noticed()`, create it again."""
    admin = admin_client(bootstrap)
    admin.delete_topics([spec.name], operation_timeout=30)[spec.name].result(30)
    wait_for(noticed, 30, f"the deletion of {spec.name} noticed", interval_s=0.2)

    def created() -> bool:
        try:
            return ensure_topics(admin, (spec,), deadline_s=5) == [spec.name]
        except Exception:  # noqa: BLE001 - the broker still deletes it: ask again
            return False

    wait_for(created, 30, f"{spec.name} created again", interval_s=0.5)


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


@pytest.fixture
def joiners(bootstrap: str) -> Iterator[list[JoinerProcess]]:
    started: list[JoinerProcess] = []
    yield started
    for joiner in started:
        joiner.kill()
    delete_internal_topics(bootstrap, sorted({joiner.group_id for joiner in started}))


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


@pytest.mark.slow
def test_the_spark_joiner_counts_records_deleted_before_its_batch_read_them(bootstrap, new_topics, tmp_path):
    """Two starts of the Spark job (about a minute each on two shared cores): under `make reliability`."""
    from spark_support import SparkJoinerProcess

    topics = new_topics()
    ends = produce(bootstrap, topics.data, records(0, 300))
    joiner = SparkJoinerProcess(bootstrap, topics, tmp_path / "checkpoint", tmp_path)
    try:
        joiner.start()
        wait_for(lambda: logged_total(joiner.log(), "rows in") == 300, 240, "the first records read", interval_s=0.5)
        assert joiner.terminate() == 0

        # While it is down, 700 more arrive and retention deletes the first 25 of them in every partition.
        after = produce(bootstrap, topics.data, records(300, 700))
        deleted_to = {partition: min(ends.get(partition, 0) + 25, end) for partition, end in after.items()}
        delete_records_before(bootstrap, topics.data, deleted_to)
        deleted = sum(deleted_to[partition] - ends.get(partition, 0) for partition in deleted_to)

        joiner.start()
        wait_for(lambda: logged_total(joiner.log(), "rows in") == 700 - deleted, 240, "the records left read",
                 interval_s=0.5)
        wait_for(lambda: logged_total(joiner.log(), "records skipped") == deleted, 30,
                 f"{deleted} deleted unread")
        assert re.search(r"WARNING .*input records skipped unread \(deleted by retention", joiner.log())
    finally:
        joiner.kill()


@pytest.mark.slow
def test_the_spark_joiner_counts_its_input_topic_deleted_and_what_it_skips_of_the_new_one(bootstrap, new_topics,
                                                                                            tmp_path):
    from spark_support import SparkJoinerProcess

    topics = new_topics()

    produce(bootstrap, topics.data, records(0, 300))
    joiner = SparkJoinerProcess(bootstrap, topics, tmp_path / "checkpoint", tmp_path)
    try:
        joiner.start()
        wait_for(lambda: logged_total(joiner.log(), "rows in") == 300, 240, "the first records read", interval_s=0.5)
        recreate(bootstrap, TopicSpec(topics.data, MACHINE_DATA.partitions, dict(MACHINE_DATA.config)))
        produce(bootstrap, topics.data, records(300, 150))
        wait_for(lambda: logged_total(joiner.log(), "topics deleted") == 1, 120, "the deletion counted", interval_s=0.5)
        # Spark's source goes on from its checkpoint's offsets, not from the new topic's start: whatever of the new
        # records it does not read is counted as skipped. None is silent.
        wait_for(lambda: logged_total(joiner.log(), "rows in") + logged_total(joiner.log(), "records skipped") == 450,
                 120, "every new record read or counted as skipped", interval_s=0.5)
        assert re.search(rf"WARNING .*input topic {re.escape(topics.data)} was deleted", joiner.log())
        assert joiner.alive()
    finally:
        joiner.kill()
