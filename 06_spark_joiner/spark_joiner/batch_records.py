"""A micro-batch's processor rows produced as Kafka records: joins to machine.out, dead letters to machine.dlq.

Each topic's records go in the processor's order, machine.out's first. A dead letter larger than machine.dlq
takes (a topic made with a lower limit than the default) goes with its payload omitted, as does one the client
refuses for its size; any other record the client refuses fails the batch (an output record is a few kB: never
expected), which the sink's transaction then aborts.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaException, Producer

from pipeline_core.kafka_clients import produce
from pipeline_core.records import payload_omitted

from .bucket_join import DLQ
from .encode import STAGE


def produce_batch(producer: Producer, rows: pa.Table, output_topic: str, dlq_topic: str,
                  dead_letter_max_bytes: int) -> int:
    """Produce the batch's records (within the producer's open transaction); returns the number of dead letters."""
    is_dead_letter = pc.equal(rows.column("kind"), DLQ)
    dead_letters = rows.filter(is_dead_letter)
    joins = rows.filter(pc.invert(is_dead_letter))
    _produce_to(producer, output_topic, joins.column("value").to_pylist(), joins.column("key").to_pylist(), None)
    values = [value if len(value) <= dead_letter_max_bytes
              else payload_omitted(value, f"larger than the {dlq_topic} limit", STAGE)
              for value in dead_letters.column("value").to_pylist()]
    _produce_to(producer, dlq_topic, values, dead_letters.column("key").to_pylist(), dlq_topic)
    return dead_letters.num_rows


def _produce_to(producer: Producer, topic: str, values: list[bytes], keys: list[str | None],
                dlq_topic: str | None) -> None:
    produce_one = producer.produce
    for value, key in zip(values, keys):
        try:
            produce_one(topic, value, key)
        except (BufferError, KafkaException):  # a full local queue, or a record the client refuses
            refused = produce(producer, topic, value, key)  # waits out the first, returns the second
            if refused is not None and topic == dlq_topic:
                refused = produce(producer, topic, payload_omitted(value, refused.str(), STAGE), key)
            if refused is not None:
                raise KafkaException(refused) from None
