"""Each server of the native stack really works: MQTT round trip, Kafka transactions, InfluxDB."""
from __future__ import annotations

import json
import queue
import time

import paho.mqtt.client as mqtt
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from pipeline_core.influx import influx_client
from pipeline_core.kafka_clients import consumer_config, producer_config, transactional_producer_config
from pipeline_core.settings import ConnectionSettings
from support import read_topic, unique, wait_for

pytestmark = pytest.mark.integration


def test_mqtt_publish_and_receive(stack: ConnectionSettings) -> None:
    topic = unique("test/roundtrip").replace(".", "/")
    received: queue.Queue[bytes] = queue.Queue()
    subscribed: queue.Queue[bool] = queue.Queue()

    subscriber = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=unique("sub"))
    subscriber.on_message = lambda _c, _u, message: received.put(message.payload)
    subscriber.on_subscribe = lambda *_args: subscribed.put(True)
    subscriber.connect(stack.mqtt_host, stack.mqtt_port)
    subscriber.loop_start()
    publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=unique("pub"))
    try:
        subscriber.subscribe(topic, qos=1)
        assert subscribed.get(timeout=10)
        publisher.connect(stack.mqtt_host, stack.mqtt_port)
        publisher.loop_start()
        info = publisher.publish(topic, b'{"Thing": "R0815"}', qos=1)
        info.wait_for_publish(timeout=10)
        assert info.is_published()
        assert received.get(timeout=10) == b'{"Thing": "R0815"}'
    finally:
        publisher.loop_stop()
        publisher.disconnect()
        subscriber.loop_stop()
        subscriber.disconnect()


def test_kafka_produce_and_consume(bootstrap: str, new_topics) -> None:
    topic = new_topics().data
    producer = Producer(producer_config(bootstrap))
    for i in range(100):
        producer.produce(topic, json.dumps({"n": i}).encode(), key=f"R0815.q{i % 7}")
    assert producer.flush(30) == 0
    messages = read_topic(bootstrap, topic, expected=100)
    assert sorted(json.loads(m.value)["n"] for m in messages) == list(range(100))
    # one key, one partition, in order: what every time series relies on
    by_key: dict[bytes, list[int]] = {}
    for message in sorted(messages, key=lambda m: (m.partition, m.offset)):
        by_key.setdefault(message.key, []).append(json.loads(message.value)["n"])
    assert all(values == sorted(values) for values in by_key.values())
    assert len({m.partition for m in messages}) > 1


def test_read_committed_sees_committed_never_aborted(bootstrap: str, new_topics) -> None:
    topics = new_topics()
    producer = Producer(transactional_producer_config(bootstrap, unique("test-tx")))
    producer.init_transactions(30)

    producer.begin_transaction()
    for i in range(10):
        producer.produce(topics.out, json.dumps({"tx": "committed", "n": i}).encode(), key=b"k")
    producer.commit_transaction(30)

    producer.begin_transaction()
    for i in range(10):
        producer.produce(topics.out, json.dumps({"tx": "aborted", "n": i}).encode(), key=b"k")
    producer.flush(30)  # the aborted records really reach the log before the abort
    producer.abort_transaction(30)

    producer.begin_transaction()
    producer.produce(topics.out, json.dumps({"tx": "committed", "n": 10}).encode(), key=b"k")
    producer.commit_transaction(30)

    committed = read_topic(bootstrap, topics.out, isolation="read_committed")
    assert [json.loads(m.value) for m in committed] == [{"tx": "committed", "n": i} for i in range(11)]
    everything = read_topic(bootstrap, topics.out, isolation="read_uncommitted")
    assert sum(json.loads(m.value)["tx"] == "aborted" for m in everything) == 10


def test_offsets_commit_inside_a_transaction(bootstrap: str, new_topics) -> None:
    """Consume-transform-produce: output and input progress commit atomically."""
    topics = new_topics()
    input_producer = Producer(producer_config(bootstrap))
    input_producer.produce(topics.data, b"input", key=b"k")
    assert input_producer.flush(30) == 0
    group = unique("test-eos")
    consumer = Consumer(consumer_config(bootstrap, group))
    consumer.subscribe([topics.data])
    try:
        message = wait_for(lambda: (m := consumer.poll(0.5)) is not None and not m.error() and m, 30,
                           "the input record")
    except AssertionError:
        consumer.close()
        raise
    producer = Producer(transactional_producer_config(bootstrap, unique("test-eos-tx")))
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topics.out, b"output", key=b"k")
    producer.send_offsets_to_transaction(
        [TopicPartition(message.topic(), message.partition(), message.offset() + 1)],
        consumer.consumer_group_metadata(), 30)
    producer.commit_transaction(30)
    consumer.close()

    committed = Consumer(consumer_config(bootstrap, group)).committed(
        [TopicPartition(topics.data, message.partition())], timeout=30)
    assert committed[0].offset == message.offset() + 1
    assert [m.value for m in read_topic(bootstrap, topics.out)] == [b"output"]


def test_influxdb_write_and_query(stack: ConnectionSettings) -> None:
    client = influx_client(stack)
    measurement = unique("test_points").replace(".", "_")
    now_ms = int(time.time() * 1000)  # inside any retention policy the database's default may have
    assert client.write_points([{"measurement": measurement, "tags": {"thing": "R0815"},
                                 "time": now_ms, "fields": {"result": 288.2}}], time_precision="ms")
    points = list(client.query(f'SELECT "result" FROM "{measurement}"', epoch="ms").get_points())
    assert points == [{"time": now_ms, "result": 288.2}]
    client.query(f'DROP MEASUREMENT "{measurement}"')
