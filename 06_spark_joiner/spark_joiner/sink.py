"""The exactly-once sink: each micro-batch's records in one Kafka transaction, each batch id once.

Spark's own Kafka sink is at-least-once: a batch that ran but whose checkpoint commit was lost runs
again after a restart and writes again. Here every batch commits in a Kafka transaction that also
stores the batch id, as the committed offset of a marker partition in the sink's own consumer group
(``send_offsets_to_transaction``), atomically with the records. On restart the sink reads the marker
and skips every batch id at or below it: a replayed batch is never written twice. The transactional id
is fixed per job, so a restarted driver fences its predecessor and aborts whatever it left open.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from pyspark.sql import DataFrame

from pipeline_core.kafka_clients import (DEFAULT_STARTUP_DEADLINE_S, admin_client, consumer_config, produce,
                                         raise_partition_errors, retry_transient, transactional_producer_config)
from pipeline_core.records import payload_omitted
from pipeline_core.topics import dead_letter_limit

from .encode import STAGE
from .processor import DLQ, unpack_emitted

log = logging.getLogger(__name__)

# Records the driver may queue while producing one batch before it has to wait for deliveries.
_QUEUE_MESSAGES = 1_000_000


@dataclass
class SinkCounters:
    batches: int = 0
    skipped_batches: int = 0  # replayed batch ids already committed before a restart
    joins: int = 0
    dead_letters: int = 0
    last_batch_id: int = -1
    compute_seconds: float = 0.0  # running the micro-batch up to its rows in the driver
    produce_seconds: float = 0.0  # producing them and committing the transaction


class TransactionalBatchSink:
    """``foreachBatch`` function writing the processor's rows to machine.out / machine.dlq exactly once."""

    def __init__(self, bootstrap_servers: str, output_topic: str, dlq_topic: str, transactional_id: str,
                 startup_deadline_s: float = DEFAULT_STARTUP_DEADLINE_S) -> None:
        self.output_topic = output_topic
        self.dlq_topic = dlq_topic
        # Uncompressed, as the standalone joiner writes: lz4 cost the client threads and the broker several µs
        # of the same cores per record, for records that only cross the loopback or a cluster's network.
        self.producer = Producer(transactional_producer_config(
            bootstrap_servers, transactional_id,
            **{"queue.buffering.max.messages": _QUEUE_MESSAGES, "linger.ms": 20, "transaction.timeout.ms": 120_000,
               "compression.type": "none"}))
        # A broker that has only just started answers both calls below with NOT_COORDINATOR or
        # COORDINATOR_NOT_AVAILABLE for a few seconds, while it creates __transaction_state and __consumer_offsets.
        request_timeout = min(30.0, startup_deadline_s)
        # Fences an earlier instance of this job and aborts its open transaction, before the marker is read.
        retry_transient(lambda: self.producer.init_transactions(request_timeout),
                        what=f"initialising the sink's transactions ({transactional_id})", deadline_s=startup_deadline_s)
        # The marker lives in the group named like the transactional id; this consumer never subscribes.
        self._marker_group = Consumer(consumer_config(bootstrap_servers, transactional_id))
        self._marker = TopicPartition(output_topic, 0)
        last_batch_id = retry_transient(lambda: self._committed_batch_id(request_timeout),
                                        what=f"reading the sink's last committed batch (group {transactional_id})",
                                        deadline_s=startup_deadline_s)
        self.counters = SinkCounters(last_batch_id=last_batch_id)
        # The processor's letters are under machine.dlq's default limit; a DLQ topic made with a lower one would
        # refuse larger letters and fail every batch holding one.
        self.dead_letter_max_bytes = dead_letter_limit(admin_client(bootstrap_servers), dlq_topic, startup_deadline_s)
        log.info("sink ready: transactional id %s, last committed batch %d", transactional_id,
                 self.counters.last_batch_id)

    def _committed_batch_id(self, timeout: float) -> int:
        committed = raise_partition_errors(self._marker_group.committed([self._marker], timeout=timeout))[0]
        return committed.offset - 1 if committed.offset >= 0 else -1

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        if batch_id <= self.counters.last_batch_id:
            self.counters.skipped_batches += 1
            log.info("batch %d was committed before the restart: skipped", batch_id)
            return
        began = time.monotonic()
        rows = unpack_emitted(batch.toArrow().column("records").to_pylist())
        computed = time.monotonic()
        self.producer.begin_transaction()
        try:
            dead_letters = self._produce(rows)
            marker = TopicPartition(self.output_topic, 0, batch_id + 1, f"spark batch {batch_id}")
            self.producer.send_offsets_to_transaction([marker], self._marker_group.consumer_group_metadata(), 60)
            self._commit()
        except KafkaException:
            self.producer.abort_transaction(60)
            raise
        counters = self.counters
        counters.batches += 1
        counters.joins += rows.num_rows - dead_letters
        counters.dead_letters += dead_letters
        counters.last_batch_id = batch_id
        counters.compute_seconds += computed - began
        counters.produce_seconds += time.monotonic() - computed
        log.debug("batch %d: %d records computed in %.2f s, produced and committed in %.2f s", batch_id, rows.num_rows,
                  computed - began, time.monotonic() - computed)

    def _produce(self, rows: pa.Table) -> int:
        """Produce the batch's records, machine.out's then machine.dlq's (each topic in the processor's
        order); returns the number of dead letters."""
        is_dead_letter = pc.equal(rows.column("kind"), DLQ)
        dead_letters = rows.filter(is_dead_letter)
        for topic, records in ((self.output_topic, rows.filter(pc.invert(is_dead_letter))),
                               (self.dlq_topic, dead_letters)):
            self._produce_to(topic, records.column("value").to_pylist(), records.column("key").to_pylist())
        return dead_letters.num_rows

    def _produce_to(self, topic: str, values: list[bytes], keys: list[str | None]) -> None:
        produce_one = self.producer.produce
        if topic == self.dlq_topic:
            values = [value if len(value) <= self.dead_letter_max_bytes
                      else payload_omitted(value, f"larger than the {topic} limit", STAGE) for value in values]
        for value, key in zip(values, keys):
            try:
                produce_one(topic, value, key)
            except (BufferError, KafkaException):  # a full local queue, or a record the client refuses
                refused = produce(self.producer, topic, value, key)  # waits out the first, returns the second
                if refused is not None and topic == self.dlq_topic:
                    refused = produce(self.producer, topic, payload_omitted(value, refused.str(), STAGE), key)
                if refused is not None:  # an output record is a few kB: never expected
                    raise KafkaException(refused) from None

    def _commit(self) -> None:
        deadline = time.monotonic() + 120
        while True:
            try:
                self.producer.commit_transaction(60)
                return
            except KafkaException as error:
                if not error.args[0].retriable() or time.monotonic() > deadline:
                    raise

    def close(self) -> None:
        self._marker_group.close()
        self.producer.flush(30)
