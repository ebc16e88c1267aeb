"""Reading back what a run left in Kafka: one partition's records between two offsets, as a committed reader sees
them (read_committed: aborted transactions and their markers are not delivered)."""
from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from pipeline_core.kafka_clients import consumer_config

BATCH = 10_000
# No record for this long while the partition's end is not reached: Kafka is not serving what it said it holds.
STALL_S = 120.0


@dataclass(frozen=True)
class PartitionRange:
    topic: str
    partition: int
    start: int  # first offset of the run
    end: int  # the partition's last stable offset once the run settled


def read_values(bootstrap: str, security: Mapping[str, str], span: PartitionRange) -> Iterator[list[bytes]]:
    """The values of `span`'s records, in offset order, in batches (tombstones left out)."""
    if span.end <= span.start:
        return
    consumer = Consumer({**consumer_config(bootstrap, f"soak-readback-{os.getpid()}-{time.time_ns()}", **security),
                         "enable.partition.eof": True, "fetch.max.bytes": 64 * 1024 * 1024,
                         "max.partition.fetch.bytes": 16 * 1024 * 1024})
    try:
        consumer.assign([TopicPartition(span.topic, span.partition, span.start)])
        position = span.start
        last_progress = time.monotonic()
        while position < span.end:
            batch = []
            at_end = False
            for message in consumer.consume(BATCH, timeout=1.0):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        at_end = True  # what lies between here and `end` is markers or aborted records
                    elif error.fatal():
                        raise KafkaException(error)
                    continue
                position = message.offset() + 1
                if message.offset() >= span.end:
                    break  # written after the run settled: not the run's
                if message.value() is not None:
                    batch.append(message.value())
            if batch:
                last_progress = time.monotonic()
                yield batch
            if at_end:
                return
            if time.monotonic() - last_progress > STALL_S:
                raise TimeoutError(f"{span.topic}[{span.partition}]: no record for {STALL_S:.0f} s at offset "
                                   f"{position}, before its end {span.end}")
    finally:
        consumer.close()
