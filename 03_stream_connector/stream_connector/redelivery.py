"""A row that arrives again is not written twice.

The broker sends a row again when the connector crashed, lost its MQTT connection or started its
Kafka client afresh before acknowledging it; a publisher sends a row again when its acknowledgement
got lost in a broker restart (QoS 1 is at least once), and the broker passes it on as a new message.
Some or all of its records may be in machine.data already. Written again, each copy would reach a
joiner as a record older than the last of its series: rejected as out of order, a good record in
machine.dlq. So the connector remembers the records Kafka confirmed lately, starting from the tail
of machine.data when it starts, and those on their way, and writes of each row only the records that are
in neither (`Redelivery`): a row sent again while an earlier copy's record is on its way waits for that record.

A record is known by its encoded value: the same row always encodes to the same bytes. A row with
something to dead-letter is known by its MQTT topic and payload (`rejected_row_key`), and its dead letter,
which Kafka confirmed already, is not written again either.

The tail must hold every record Kafka holds, and a reader sees a record only once every in-sync follower has it
(the high watermark). A killed connector's last records may still wait for a follower that lags, is cut off or
frozen (until the controller drops it from the in-sync replicas, about 9 s): a tail read then misses them, their
rows are written again, and both copies land in machine.data, the second behind newer records, which the joiners
dead-letter as out of order. Kafka tells no client where a partition's log ends, but it acknowledges a record
written with acks=all only once the high watermark has passed it, and so every record the leader appended before
it. So before reading the tails the connector writes one record to every partition and waits for each
acknowledgement (`settle_unseen_writes`), in a transaction it then aborts: no read_committed reader, every stage
of the pipeline, ever sees those records.
"""
from __future__ import annotations

import base64
import hashlib
import json
import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from pipeline_core.kafka_clients import (TRANSACTIONAL_CALL_TIMEOUT_S, KafkaStartupError, consumer_config,
                                         retry_transient, transactional_producer_config)

from .row_state import Row

log = logging.getLogger(__name__)

TAIL_READ_TIMEOUT_S = 60.0
# The transactional ids of the fence before the tails are read: this and the instance's MQTT client id (the stack
# grants the prefix: stack.kafka_acls).
FENCE_TRANSACTIONAL_ID_PREFIX = "stream-connector-fence."
# Should the connector stop before aborting its fence, the broker aborts it after this, and read_committed readers
# of the fenced partitions wait until then: short, yet far above a follower's removal from the in-sync replicas.
FENCE_TRANSACTION_TIMEOUT_MS = 30_000
# What a fence record says to a reader that reads aborted transactions too (none of the pipeline's stages does).
FENCE_VALUE = b"stream connector start-up fence (aborted transaction)"
# The offsets a fence takes of every partition: its record and the abort marker. Offsets are no record count.
FENCE_OFFSETS_PER_PARTITION = 2


def fence_transactional_id(mqtt_client_id: str) -> str:
    return FENCE_TRANSACTIONAL_ID_PREFIX + mqtt_client_id


def settle_unseen_writes(bootstrap_servers: str, partitions: Mapping[str, int], transactional_id: str, *,
                         security: Mapping[str, str] | None = None,
                         timeout_s: float = TRANSACTIONAL_CALL_TIMEOUT_S) -> None:
    """Return once every record the leaders of `partitions` (topic -> partition count) have appended is readable:
    one record written to each partition with acks=all and acknowledged, in a transaction then aborted (see the
    module docstring). Raises `KafkaException` (transient: ask again, `retry_transient`), or `SystemExit` when
    Kafka refuses the transactional id."""
    producer = Producer(transactional_producer_config(bootstrap_servers, transactional_id, **(security or {}), **{
        "transaction.timeout.ms": FENCE_TRANSACTION_TIMEOUT_MS}))
    failures: list[KafkaError] = []

    def delivered(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            failures.append(error)

    try:
        producer.init_transactions(timeout_s)
        producer.begin_transaction()
        for topic, count in partitions.items():
            for partition in range(count):
                producer.produce(topic, FENCE_VALUE, partition=partition, on_delivery=delivered)
        unacknowledged = producer.flush(timeout_s)
        if failures:
            raise KafkaException(failures[0])
        if unacknowledged:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"{unacknowledged} fence records unacknowledged "
                                            f"after {timeout_s:.0f} s", retriable=True))
        producer.abort_transaction(timeout_s)
    except KafkaException as error:
        if error.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            raise SystemExit(f"Kafka refused the transactional id {transactional_id!r}: grant the connector's "
                             f"principal Write and Describe on transactional ids prefixed "
                             f"{FENCE_TRANSACTIONAL_ID_PREFIX!r}, then start it again") from error
        raise  # the next attempt's init_transactions aborts what this one left open


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


class Remembered:
    """Of one kind (records by their value, or dead letters by their row's `rejected_row_key`): those Kafka confirmed
    lately (`held`, read from the topic's tail at start), and those on their way, each with the rows sent again that
    wait for it instead of writing it a second time."""

    def __init__(self, held: WrittenRecords) -> None:
        self.held = held
        self._on_their_way: dict[bytes, list[Row]] = {}

    def to_write(self, key: bytes, row: Row) -> bool:
        """Whether `row` must write the one known as `key`: not when Kafka holds it already, nor when it is on its way
        (its row let go at a reconnect while Kafka was away: then `row` waits for it)."""
        if key in self.held:
            return False
        waiting = self._on_their_way.get(key)
        if waiting is None:
            return True
        waiting.append(row)
        row.awaits()
        return False

    def sent(self, key: bytes) -> None:
        self._on_their_way[key] = []

    def answered(self, key: bytes, error: KafkaError | None) -> Iterable[Row]:
        """Kafka answered for the one known as `key`: remembered if confirmed; the rows that waited for it."""
        if error is None:
            self.held.add(key)
        return self._on_their_way.pop(key, ())

    def any_on_their_way(self) -> bool:
        return bool(self._on_their_way)

    def forget_on_their_way(self) -> None:
        self._on_their_way.clear()


class Redelivery:
    """What of a row must still be written: its records (`records`, by value) and its dead letter (`letters`, by
    `rejected_row_key`) that Kafka neither holds nor has on their way."""

    def __init__(self, capacity: int) -> None:
        self.records = Remembered(WrittenRecords(capacity))
        self.letters = Remembered(WrittenRecords(capacity))

    def records_to_write(self, records: list, row: Row) -> list:
        """Of a row's records (value first), those to write: all of them, unless the row was sent again."""
        to_write = self.records.to_write
        return [record for record in records if to_write(record[0], row)]

    def any_on_their_way(self) -> bool:
        """Whether a record or dead letter handed to the producer still waits for Kafka's answer."""
        return self.records.any_on_their_way() or self.letters.any_on_their_way()

    def forget_on_their_way(self) -> None:
        """The producer's records were dropped (a fresh Kafka client): they come again with their rows."""
        self.records.forget_on_their_way()
        self.letters.forget_on_their_way()


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
