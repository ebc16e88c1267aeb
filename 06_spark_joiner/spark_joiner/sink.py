"""The exactly-once sink: each micro-batch's records in one Kafka transaction, each input record's once.

Spark's own Kafka sink is at-least-once: a batch that ran but whose checkpoint commit was lost runs
again after a restart and writes again. Here every batch commits in a Kafka transaction that also
stores the input offsets it covered (its end in every partition of the input, from the checkpoint's
offset log), as the committed offsets of the sink's own consumer group (``send_offsets_to_transaction``),
atomically with the records. So Kafka always knows up to where the input's outputs are written,
whatever becomes of the checkpoint. At each query start the sink reads that position and the processor
(`processor.BucketJoinProcessor`) joins the input before it only to rebuild its state, dropping what
it would emit: a batch replayed after a crash, a checkpoint restored from a backup, and a checkpoint
deleted (the query then starts from the input's beginning, rebuilding all state) are one case, and
each output is written once. The transactional id is fixed per job, so a restarted driver fences its
predecessor and aborts whatever it left open.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from pyspark.sql import DataFrame, SparkSession

from pipeline_core.kafka_clients import (DEFAULT_STARTUP_DEADLINE_S, KafkaCallWedged, admin_client, call_bounded,
                                         consumer_config, produce, raise_partition_errors, retry_transient,
                                         transactional_producer_config)
from pipeline_core.records import payload_omitted
from pipeline_core.topics import dead_letter_limit

from .encode import STAGE
from .processor import DLQ, unpack_emitted

log = logging.getLogger(__name__)

# Records the driver may queue while producing one batch before it has to wait for deliveries.
_QUEUE_MESSAGES = 1_000_000
# How long one transactional call may wait for Kafka.
_TRANSACTION_CALL_S = 60


@dataclass
class SinkCounters:
    batches: int = 0
    skipped_batches: int = 0  # batches whose input was all committed before: they only rebuilt state
    joins: int = 0
    dead_letters: int = 0
    last_batch_id: int = -1
    compute_seconds: float = 0.0  # running the micro-batch up to its rows in the driver
    produce_seconds: float = 0.0  # producing them and committing the transaction
    # Input records a rebuild (a new checkpoint after committed outputs) needed and retention had deleted:
    # the join state it rebuilt misses them, so pairs around them may differ from what the old state gave.
    rebuild_records_lost: int = 0


class TransactionalBatchSink:
    """``foreachBatch`` function writing the processor's rows to machine.out / machine.dlq exactly once."""

    def __init__(self, bootstrap_servers: str, output_topic: str, dlq_topic: str, transactional_id: str,
                 startup_deadline_s: float = DEFAULT_STARTUP_DEADLINE_S,
                 security: Mapping[str, str] | None = None) -> None:
        self.output_topic = output_topic
        self.dlq_topic = dlq_topic
        # Uncompressed, as the standalone joiner writes: lz4 cost the client threads and the broker several µs
        # of the same cores per record, for records that only cross the loopback or a cluster's network.
        self._producer_config = transactional_producer_config(
            bootstrap_servers, transactional_id, **(security or {}),
            **{"queue.buffering.max.messages": _QUEUE_MESSAGES, "linger.ms": 20, "transaction.timeout.ms": 120_000,
               "compression.type": "none"})
        # A broker that has only just started answers both calls below with NOT_COORDINATOR or
        # COORDINATOR_NOT_AVAILABLE for a few seconds, while it creates __transaction_state and __consumer_offsets.
        self._request_timeout = min(30.0, startup_deadline_s)
        self._startup_deadline_s = startup_deadline_s
        self.producer = self._new_producer()
        # The committed input positions live in the group named like the transactional id; this consumer
        # never subscribes.
        self._group = Consumer(consumer_config(bootstrap_servers, transactional_id, **(security or {})))
        self._group_id = transactional_id
        self.input_topic = ""
        self.offset_log = ""  # the checkpoint's offset log: where each batch's input ends
        self.committed: dict[int, int] = {}  # input partition -> offset up to which the outputs are in Kafka
        self.counters = SinkCounters()
        # The processor's letters are under machine.dlq's default limit; a DLQ topic made with a lower one would
        # refuse larger letters and fail every batch holding one.
        self.dead_letter_max_bytes = dead_letter_limit(admin_client(bootstrap_servers, **(security or {})), dlq_topic,
                                                       startup_deadline_s)

    def _new_producer(self) -> Producer:
        """The job's transactional producer. Its init fences an earlier one of the same transactional id (a
        crashed driver's, or a wedged one of this process) and aborts what that left open."""
        producer = Producer(self._producer_config)
        retry_transient(lambda: producer.init_transactions(self._request_timeout), deadline_s=self._startup_deadline_s,
                        what=f"initialising the sink's transactions ({self._producer_config['transactional.id']})")
        return producer

    def resume(self, input_topic: str, checkpoint_dir: str) -> dict[int, int]:
        """Before a query starts on ``checkpoint_dir``: read the committed input position of every partition
        of ``input_topic`` (partition -> offset; absent where nothing is committed) and return it."""
        self.input_topic = input_topic
        self.offset_log = f"{checkpoint_dir.rstrip('/')}/offsets"
        self.committed = retry_transient(self._committed_input, deadline_s=self._startup_deadline_s,
                                         what=f"reading the sink's committed input (group {self._group_id})")
        log.info("sink ready: outputs committed up to input offsets %s of %s",
                 dict(sorted(self.committed.items())) or "(none)", input_topic)
        return dict(self.committed)

    def _committed_input(self) -> dict[int, int]:
        metadata = self._group.list_topics(self.input_topic, timeout=self._request_timeout).topics[self.input_topic]
        if metadata.error is not None:
            raise KafkaException(metadata.error)
        partitions = [TopicPartition(self.input_topic, partition) for partition in sorted(metadata.partitions)]
        committed = raise_partition_errors(self._group.committed(partitions, timeout=self._request_timeout))
        positions = {}
        for position in committed:
            if position.offset < 0:
                continue
            _low, high = self._group.get_watermark_offsets(position, timeout=self._request_timeout)
            if position.offset > high:
                # Offsets never shrink: the topic was deleted and created again, and its outputs begin anew.
                log.warning("%s [%d] ends at %d, before the outputs' committed input offset %d: the topic was "
                            "recreated; its records are joined as new", self.input_topic, position.partition, high,
                            position.offset)
                continue
            positions[position.partition] = position.offset
        return positions

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        began = time.monotonic()
        ends = self._batch_ends(batch.sparkSession, batch_id)
        if batch_id == 0 and self.committed:
            self._rebuilding()
        # Always run the batch: it is what stores the join state, also where all its outputs are dropped.
        rows = unpack_emitted(batch.toArrow().column("records").to_pylist())
        computed = time.monotonic()
        advanced = {partition: end for partition, end in ends.items() if end > self.committed.get(partition, -1)}
        if not advanced and not rows.num_rows:
            self.counters.skipped_batches += 1
            log.info("batch %d: its input was committed before (a replayed or rebuilt batch): state only", batch_id)
            return
        self.producer.begin_transaction()
        try:
            dead_letters = self._produce(rows)
            if advanced:
                positions = [TopicPartition(self.input_topic, partition, end, f"spark batch {batch_id}")
                             for partition, end in sorted(advanced.items())]
                # Bounded from outside: librdkafka may wait for ever here while Kafka nodes return
                # (pipeline_core.kafka_clients.call_bounded).
                call_bounded(lambda: self.producer.send_offsets_to_transaction(
                    positions, self._group.consumer_group_metadata(), _TRANSACTION_CALL_S),
                    _TRANSACTION_CALL_S + 5, what=f"committing batch {batch_id}'s input offsets")
            self._commit()
        except KafkaCallWedged:
            # Its producer can do nothing else: a new one fences it and aborts the open transaction, and
            # Spark runs the batch again.
            log.warning("batch %d: Kafka did not answer its transaction's offsets; replacing the producer", batch_id)
            self.producer = self._new_producer()
            raise
        except BaseException:
            # Whatever failed (Kafka, a record the producer refused, an interrupt), nothing of the batch may
            # commit: Spark runs it again.
            try:
                self.producer.abort_transaction(_TRANSACTION_CALL_S)
            except KafkaException as error:
                log.warning("could not abort batch %d's transaction (the next start fences it): %s", batch_id, error)
            raise
        self.committed.update(advanced)
        counters = self.counters
        counters.batches += 1
        counters.joins += rows.num_rows - dead_letters
        counters.dead_letters += dead_letters
        counters.last_batch_id = batch_id
        counters.compute_seconds += computed - began
        counters.produce_seconds += time.monotonic() - computed
        log.debug("batch %d: %d records computed in %.2f s, produced and committed in %.2f s", batch_id, rows.num_rows,
                  computed - began, time.monotonic() - computed)

    def _batch_ends(self, spark: SparkSession, batch_id: int) -> dict[int, int]:
        """Where batch ``batch_id``'s input ends in each partition: its entry in the checkpoint's offset log
        (written before the batch runs), read through Hadoop's file system as Spark writes it."""
        if not self.offset_log:
            raise RuntimeError("the sink runs a query that was started without resume()")
        jvm = spark.sparkContext._jvm
        path = jvm.org.apache.hadoop.fs.Path(f"{self.offset_log}/{batch_id}")
        stream = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).open(path)
        try:
            text = jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()
        return batch_ends(text, self.input_topic)

    def _rebuilding(self) -> None:
        """A query's first batch after committed outputs: it rebuilds the join state from the input's
        beginning. Records retention deleted before the committed position are missing from the rebuild."""
        log.warning("a new checkpoint after committed outputs: rebuilding the join state from the beginning of %s, "
                    "outputs up to offsets %s dropped as committed", self.input_topic,
                    dict(sorted(self.committed.items())))
        lost = 0
        for partition, committed in self.committed.items():
            low, _high = self._group.get_watermark_offsets(TopicPartition(self.input_topic, partition),
                                                          timeout=self._request_timeout)
            lost += max(0, min(low, committed))
        if lost:
            self.counters.rebuild_records_lost += lost
            log.warning("rebuilding the join state from %s without its first %d records (deleted by retention): "
                        "pairs of the rebuilt state around them may differ from the committed output", self.input_topic,
                        lost)

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
                self.producer.commit_transaction(_TRANSACTION_CALL_S)
                return
            except KafkaException as error:
                if not error.args[0].retriable() or time.monotonic() > deadline:
                    raise

    def close(self) -> None:
        """Leave the group consumer. The producer has nothing left to flush: each batch's records went into
        its transaction, which the commit flushed or the abort purged; and a producer whose abort Kafka
        refused is in a fatal state, where a flush raises (librdkafka issue 4849)."""
        self._group.close()


def batch_ends(offset_log_entry: str, topic: str) -> dict[int, int]:
    """The end offsets of ``topic``'s partitions in an entry of Spark's offset log: a version line, the batch's
    metadata, then one line per source, the Kafka source's ``{"topic": {"partition": offset}}``."""
    for line in offset_log_entry.splitlines()[2:]:
        offsets = json.loads(line) if line.startswith("{") else None
        if isinstance(offsets, dict) and topic in offsets:
            return {int(partition): int(offset) for partition, offset in offsets[topic].items()}
    raise ValueError(f"no offsets of {topic} in the offset log entry {offset_log_entry[:300]!r}")
