"""The stream connector after machine.data grew: it places records by the new partition count only once the
joiners' group has read every record it placed by the old one, holding new rows meanwhile for a bounded pause.

The test is the joiner: it commits the group's offsets itself. While it reads nothing, the connector gives up after
its pause, places the held rows by the old count, says so, and tries again later; once the group has read
everything, it switches. Then every record is in machine.data once, every record placed by 8 was written after every
record placed by 5, each stream in time order across the switch, and each record names the counts it was placed
by. Two instances with disjoint filters each switch for the machines they serve."""
from __future__ import annotations

import json

from confluent_kafka import Consumer, TopicPartition

from conftest import EVENTS_FILE
from connector_support import (ConnectorProcess, connector, expected_records, read_rows,  # noqa: F401 (fixture)
                               start_simulator)
from pipeline_core.mqtt import drop_session
from pipeline_core.settings import load_settings
from simulator.replay import selected_rows
from simulator.settings import SimulatorSettings
from growth_support import grow
from pipeline_core.kafka_clients import consumer_config, retry_transient
from support import read_topic, unique, wait_for

ROWS = 1_500


def commit_ends(bootstrap: str, group: str, topic: str) -> None:
    """The group reads everything there is: its offsets at every partition's end."""
    client = Consumer(consumer_config(bootstrap, group))
    try:
        count = len(client.list_topics(topic, timeout=10).topics[topic].partitions)
        # A partition just added may have no leader the client knows of yet: asked again until it answers.
        ends = [TopicPartition(topic, partition, retry_transient(
            lambda partition=partition: client.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1],
            what=f"the end of {topic} [{partition}]", deadline_s=30))
                for partition in range(count)]
        client.commit(offsets=ends, asynchronous=False)
    finally:
        client.close()


def test_a_grown_topic_is_placed_by_once_the_joiners_read_what_was_placed_before(connector, bootstrap):
    group = unique("test-joiner-group")
    bridge = connector("--joiner-groups", group, "--partition-check-interval-s", "0.5",
                       "--switch-max-pause-s", "2", "--switch-retry-s", "2")
    simulator = start_simulator(bridge.mqtt_topic, "--events-file", str(EVENTS_FILE),
                                "--limit", str(ROWS), "--rate", "100")
    try:
        wait_for(lambda: len(read_topic(bootstrap, bridge.data_topic, partial_ok=True, deadline_s=5)) > 500, 60,
                 "the first records")
        commit_ends(bootstrap, group, bridge.data_topic)  # a position, behind by what comes next
        assert grow(bootstrap, bridge.data_topic, 8) == 8
        # A give-up may first name its own records still on their way to Kafka; the group's lag comes next.
        wait_for(lambda: f"group {group} has not read partition" in bridge.log(), 60,
                 "the connector to give up its pause while the group reads nothing")
        wait_for(lambda: commit_ends(bootstrap, group, bridge.data_topic) or "placing records by 8" in bridge.log(),
                 60, "the connector to switch once the group read everything", interval_s=0.2)
        output, _ = simulator.communicate(timeout=120)
    finally:
        simulator.kill()
    assert simulator.returncode == 0, output
    rows, _ = selected_rows(load_settings(SimulatorSettings, ["--events-file", str(EVENTS_FILE), "--limit", str(ROWS)]))
    expected = {json.dumps(record, sort_keys=True) for record in expected_records([dict(row) for row in rows])}
    messages = read_topic(bootstrap, bridge.data_topic, expected=len(expected), deadline_s=60)
    messages = read_topic(bootstrap, bridge.data_topic, idle_s=1.0, deadline_s=60)
    assert sorted(json.dumps(json.loads(m.value), sort_keys=True) for m in messages) == sorted(expected)
    by_count = {5: [m for m in messages if m.placed_by == 5], 8: [m for m in messages if m.placed_by == 8]}
    assert by_count[5] and by_count[8] and len(by_count[5]) + len(by_count[8]) == len(messages)
    assert {dict(m.headers)["partitions"] for m in by_count[8]} == {b"5,8"}
    assert max(m.timestamp_ms for m in by_count[5]) <= min(m.timestamp_ms for m in by_count[8])
    streams: dict[str, list[float]] = {}
    for message in sorted(messages, key=lambda m: (m.placed_by, m.partition, m.offset)):
        streams.setdefault(message.key.decode(), []).append(json.loads(message.value)["phenomenonTime"])
    assert all(times == sorted(times) for times in streams.values())
    log = bridge.log()
    assert "holding new rows" in log and f"group {group} has not read partition" in log, log[-3000:]
    assert bridge.terminate() == 0


def test_two_instances_each_switch_for_the_machines_they_serve(stack, new_topics, bootstrap, tmp_path):
    """Two connectors with disjoint filters (instance 0 the first machine, instance 1 the two others): each holds,
    drains and switches on its own, and each machine's records placed by 8 follow all of its records placed by 5."""
    topics = new_topics()
    base = f"test/{unique('switch').replace('.', '-')}/states"
    things = sorted({row["Thing"] for row in read_rows(EVENTS_FILE)})
    group = unique("test-joiner-group")
    options = ["--joiner-groups", group, "--partition-check-interval-s", "0.5", "--switch-max-pause-s", "5",
               "--switch-retry-s", "1"]
    instances = [ConnectorProcess(mqtt_topic=",".join(filters), client_id=f"{base.replace('/', '-')}-{index}",
                                  data_topic=topics.data, dlq_topic=topics.dlq,
                                  log_path=tmp_path / f"connector-{index}.log", extra=options)
                 for index, filters in enumerate([[f"{base}/{things[0]}"], [f"{base}/{t}" for t in things[1:]]])]
    simulator = None
    try:
        for instance in instances:
            instance.start()
        simulator = start_simulator(base + "/{thing}", "--events-file", str(EVENTS_FILE), "--limit", str(ROWS),
                                    "--rate", "100")
        wait_for(lambda: len(read_topic(bootstrap, topics.data, partial_ok=True, deadline_s=5)) > 500, 60,
                 "the first records")
        assert grow(bootstrap, topics.data, 8) == 8
        wait_for(lambda: commit_ends(bootstrap, group, topics.data)
                 or all("placing records by 8" in instance.log() for instance in instances), 60,
                 "both instances to switch while the group reads everything", interval_s=0.2)
        output, _ = simulator.communicate(timeout=120)
        assert simulator.returncode == 0, output
        rows, _ = selected_rows(load_settings(SimulatorSettings, ["--events-file", str(EVENTS_FILE),
                                                                   "--limit", str(ROWS)]))
        expected = sorted(json.dumps(r, sort_keys=True) for r in expected_records([dict(row) for row in rows]))
        read_topic(bootstrap, topics.data, expected=len(expected), deadline_s=60)
        messages = read_topic(bootstrap, topics.data, idle_s=1.0, deadline_s=60)
        assert [instance.terminate() for instance in instances] == [0, 0]
    finally:
        if simulator is not None:
            simulator.kill()
        for instance in instances:
            instance.close()
            drop_session(stack, instance.client_id)
    assert sorted(json.dumps(json.loads(m.value), sort_keys=True) for m in messages) == expected
    for thing in things:
        own = [m for m in messages if json.loads(m.value)["thing"] == thing]
        before, after = [m for m in own if m.placed_by == 5], [m for m in own if m.placed_by == 8]
        if before and after:
            assert max(m.timestamp_ms for m in before) <= min(m.timestamp_ms for m in after), thing
    assert any(m.placed_by == 8 for m in messages)
