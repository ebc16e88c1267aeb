"""Every long-running stage as two instances on the real servers: the work splits, and when one instance
is killed (-9) the other carries on, with nothing lost and nothing twice.

- Stream connector: two instances with disjoint topic filters share the MQTT input; each machine's rows
  reach Kafka once, in publish order, in the partition of their thing.
- DB connector: two instances in one group; the survivor of a SIGKILL takes over its partitions.
- Standalone joiner: two instances in one group; the survivor takes over; machine.out equals the offline join.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import EVENTS_FILE
from connector_support import ConnectorProcess, by_key, expected_records, read_rows, run_simulator, topic_size
from db_connector_support import (connector_args, connectors, count, database,  # noqa: F401 (fixtures)
                                  expected_raw_points, key_of, raw_records, wait_for_points)
from kafka_joiner_support import (JoinerProcess, as_multiset, joiners, new_group, offline_join,  # noqa: F401
                                  read_outputs, records_in, rows_as_records)
from pipeline_core.mqtt import drop_session
from pipeline_core.partitioning import thing_partition
from pipeline_core.records import decode_record
from pipeline_core.topics import MACHINE_DATA
from simulator.publisher import Publisher
from simulator.topics import row_topic
from support import produce_records, read_topic, unique, wait_for

pytestmark = pytest.mark.integration

# The group's session timeout in these tests: how soon the survivor gets a killed instance's partitions.
SESSION_TIMEOUT_MS = "6000"


@pytest.fixture
def two_connectors(stack, new_topics, tmp_path: Path) -> Iterator[tuple[str, list[ConnectorProcess]]]:
    """Two stream connectors on one data topic: instance 0 takes the first machine (and the base topic, where
    rows without a usable Thing go), instance 1 the other two. Yields the simulator's topic template."""
    topics = new_topics()
    base = f"test/{unique('shards').replace('.', '-')}/states"
    things = sorted({row["Thing"] for row in read_rows(EVENTS_FILE)})
    assert len(things) == 3
    shards = [[base, f"{base}/{things[0]}"], [f"{base}/{thing}" for thing in things[1:]]]
    started = []
    for index, filters in enumerate(shards):
        client_id = f"{base.replace('/', '-')}-{index}"
        started.append(ConnectorProcess(mqtt_topic=",".join(filters), client_id=client_id, data_topic=topics.data,
                                        dlq_topic=topics.dlq, log_path=tmp_path / f"connector-{index}.log"))
    try:
        yield base + "/{thing}", [process.start() for process in started]
    finally:
        for process in started:
            process.close()
            drop_session(stack, process.client_id)


def rows_in(log: str) -> int:
    """Rows the instance read, from its summary at a clean stop."""
    found = re.findall(r"stopped cleanly: rows (\d+)", log)
    assert found, log[-2000:]
    return int(found[-1])


def test_two_connectors_with_disjoint_filters_write_every_row_once_in_order(two_connectors, stack, bootstrap):
    template, instances = two_connectors
    rows = read_rows(EVENTS_FILE)
    expected = expected_records(rows)
    simulated = run_simulator(template, "--events-file", str(EVENTS_FILE))
    assert simulated.returncode == 0 and ", 0 failures" in simulated.stdout, simulated.stdout + simulated.stderr
    # A row without a Thing goes to the base topic, which instance 0 takes: dead-lettered, not lost.
    thingless = {"Timestamp": rows[0]["Timestamp"], "id": "no-thing", "vaTorque_C11": 1.0}
    publisher = Publisher(stack, f"{instances[0].client_id}-publisher")
    publisher.connect()
    publisher.publish(row_topic(template)(thingless), json.dumps(thingless))
    assert publisher.drain(30) == 0
    publisher.close()

    data_topic = instances[0].data_topic
    messages = read_topic(bootstrap, data_topic, expected=len(expected), deadline_s=90)
    letters = read_topic(bootstrap, instances[0].dlq_topic, expected=1, deadline_s=30)
    assert [instance.terminate() for instance in instances] == [0, 0]
    assert topic_size(bootstrap, data_topic) == len(expected)  # none came twice, even after the reads stopped
    records = [decode_record(message.value) for message in messages]
    for message, record in zip(messages, records):
        assert message.partition == thing_partition(record["thing"], MACHINE_DATA.partitions)
    # Per series, Kafka holds the rows as published: each machine in time order (the simulator's default).
    assert by_key(records) == {key: sorted(series, key=lambda r: r["phenomenonTime"])
                               for key, series in by_key(expected).items()}
    # Both took part, and together they read every row once.
    read = [rows_in(instance.log()) for instance in instances]
    assert sum(read) == len(rows) + 1 and min(read) > 0
    assert topic_size(bootstrap, instances[0].dlq_topic) == 1
    letter = json.loads(letters[0].value)
    assert letter["mqttTopic"] == template.split("/{thing}")[0] and "missing field Thing" in letter["reason"]


def test_two_db_connectors_one_killed_mid_stream_store_every_point_once(bootstrap, new_topics, database,
                                                                       connectors):
    topics = new_topics()
    name, client = database
    raw = raw_records(EVENTS_FILE)
    half = len(raw) // 2
    group = unique("db-connector-pair")
    produce_records(bootstrap, topics.data, raw[:half], key=key_of)
    # Small batches, so the kill lands between commits with work in flight.
    pair = [connectors(connector_args(topics, name, group, "--batch-size", "500", "--session-timeout-ms",
                                      SESSION_TIMEOUT_MS, "--group-instance-id", f"{group}-{index}"), f"db-{index}")
            for index in range(2)]
    # Both hold partitions (the second joined the group, which split them) and write.
    wait_for(lambda: all(re.search(r"assigned \S+\[", instance.log()) for instance in pair), 60,
             "both instances to hold partitions")
    wait_for(lambda: count(client, "machinedata") > 0, 60, "the first points")
    pair[0].kill()
    produce_records(bootstrap, topics.data, raw[half:], key=key_of)
    # The survivor takes the killed instance's partitions after the session timeout and writes the rest.
    wait_for_points(client, raw=expected_raw_points(raw))
    assert pair[1].alive()


def test_two_joiners_one_killed_mid_stream_join_exactly(bootstrap, new_topics, joiners, tmp_path):
    topics = new_topics()
    records = rows_as_records(EVENTS_FILE, time_order=True)
    expected, _ = offline_join(records)
    group = new_group()
    pair = [JoinerProcess(bootstrap, topics, group, tmp_path, f"{group}-{index}", "--input-partitioned-by-thing")
            for index in range(2)]
    joiners.extend(pair)
    for joiner in pair:
        joiner.start()
    wait_for(lambda: all("assigned" in joiner.log() for joiner in pair), 60, "both instances to hold partitions")
    half = len(records) // 2
    produce_records(bootstrap, topics.data, records[:half], key=key_of, by_thing=True)
    # Mid-stream: kill an instance that joined records of its partitions (three machines fill three of the
    # five partitions, so one instance may hold none of them); more records are on their way.
    wait_for(lambda: any(records_in(joiner.log()) > 0 for joiner in pair), 60, "an instance to report records in")
    victim, survivor = pair if records_in(pair[0].log()) > 0 else pair[::-1]
    victim.kill()
    produce_records(bootstrap, topics.data, records[half:], key=key_of, by_thing=True)

    # The survivor takes the killed instance's partitions, whose open transaction the broker aborts.
    outputs = read_outputs(bootstrap, topics.out, len(expected))
    assert as_multiset([m.value for m in outputs]) == as_multiset(expected)
    assert read_topic(bootstrap, topics.dlq, idle_s=0.5) == []
    assert survivor.terminate() == 0
