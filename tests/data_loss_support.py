"""Helpers of the data-loss tests: readings as records, deliveries with their offsets, what retention does,
the counters a stage's progress line reports, and a topic deleted and created again."""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from pipeline_core.kafka_clients import admin_client, consumer_config, producer_config
from pipeline_core.records import encode_record, record_key
from pipeline_core.topics import TopicSpec, ensure_topics
from support import wait_for


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


def logged_total(log: str, label: str) -> int:
    """A counter's total in the last progress line that names it."""
    totals = re.findall(rf"{label} ([\d,]+)", log)
    return int(totals[-1].replace(",", "")) if totals else 0


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
