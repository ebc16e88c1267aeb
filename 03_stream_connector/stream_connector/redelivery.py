"""A row that arrives again is not written twice.

The broker sends a row again when the connector crashed, lost its MQTT connection or started its
Kafka client afresh before acknowledging it; a publisher sends a row again when its acknowledgement
got lost in a broker restart (QoS 1 is at least once), and the broker passes it on as a new message.
Some or all of its records may be in machine.data already. Written again, each copy would reach a
joiner as a record older than the last of its series: rejected as out of order, a good record in
machine.dlq. So the connector remembers the records Kafka confirmed lately, starting from the tail
of machine.data when it starts, and writes of each row only the records that are not there yet.

A record is known by its encoded value: the same row always encodes to the same bytes. A row with
something to dead-letter is known by its MQTT topic and payload (`rejected_row_key`), and its dead letter,
which Kafka confirmed already, is not written again either.
"""
from __future__ import annotations

import base64
import hashlib
import json
import logging
from collections import deque
from collections.abc import Callable, Mapping

from confluent_kafka import Consumer, TopicPartition

from pipeline_core.kafka_clients import KafkaStartupError, consumer_config, retry_transient

log = logging.getLogger(__name__)

TAIL_READ_TIMEOUT_S = 60.0


class WrittenRecords:
    """The last `capacity` record values Kafka confirmed, for membership tests."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._order: deque[bytes] = deque()
        self._values: set[bytes] = set()

    def add(self, value: bytes) -> None:
        if value in self._values:
            return
        self._order.append(value)
        self._values.add(value)
        if len(self._order) > self.capacity:
            self._values.discard(self._order.popleft())

    def __contains__(self, value: object) -> bool:
        return value in self._values

    def __len__(self) -> int:
        return len(self._order)


def rejected_row_key(mqtt_topic: str, payload: bytes) -> bytes:
    """What identifies a row with something to dead-letter: its topic and payload (a digest, so the window
    holds a few bytes per row however large the row)."""
    return hashlib.sha1(mqtt_topic.encode("utf-8", "surrogatepass") + b"\0" + payload).digest()


def dead_letter_key(stage: str, letter: bytes) -> bytes | None:
    """`rejected_row_key` of the row a dead letter of `stage` in machine.dlq holds; None for other letters."""
    try:
        envelope = json.loads(letter)
        if not isinstance(envelope, dict) or envelope.get("stage") != stage or "payloadBytes" in envelope:
            return None  # another stage's, or a payload truncated for Kafka: not the row as it came
        if "payloadBase64" in envelope:
            payload = base64.b64decode(envelope["payloadBase64"])
        else:
            payload = envelope["payload"].encode("utf-8")
        return rejected_row_key(envelope["mqttTopic"], payload)
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeEncodeError):
        return None


def read_tail(bootstrap_servers: str, topic: str, partitions: int, capacity: int,
              key_of: Callable[[bytes], bytes | None] = bytes, *,
              security: Mapping[str, str] | None = None) -> WrittenRecords:
    """The last records of every partition of `topic`, up to `capacity` in all per partition, each known by
    `key_of(value)` (its value itself by default; None: not remembered). `security`: the client's
    (kafka_clients.security_config)."""
    written = WrittenRecords(capacity * partitions)
    consumer = Consumer(consumer_config(bootstrap_servers, "stream-connector-tail", **(security or {}), **{
        "enable.auto.commit": False, "enable.partition.eof": True}))
    try:
        ends = {}
        for partition in range(partitions):
            low, high = retry_transient(
                lambda p=partition: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5),
                what=f"reading the end offsets of {topic}")
            if high > low:
                ends[partition] = (max(low, high - capacity), high)
        consumer.assign([TopicPartition(topic, p, start) for p, (start, _) in ends.items()])
        left = dict(ends)
        while left:
            message = consumer.poll(TAIL_READ_TIMEOUT_S)
            if message is None:
                raise KafkaStartupError(f"reading the tail of {topic}: no records within {TAIL_READ_TIMEOUT_S:.0f} s "
                                        "though Kafka reported them; check Kafka (`make status`, `make logs "
                                        "SERVICE=kafka`), then start again")
            if message.error():
                if message.error().code() == message.error()._PARTITION_EOF:
                    left.pop(message.partition(), None)
                continue
            key = key_of(message.value() or b"")
            if key is not None:
                written.add(key)
            if message.offset() + 1 >= left.get(message.partition(), (0, 0))[1]:
                left.pop(message.partition(), None)
    finally:
        consumer.close()
    log.info("read the last %d records of %s: a redelivered row writes only what is not among them",
             len(written), topic)
    return written
