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

Batches whose records are not all tied to input offsets (the idle release's, made by a processing-time timer)
are recognised by their id: each transaction names its batch and the checkpoint's query in the committed
offsets' metadata, and a batch of that query at or below the last one named is not written again.

Spark runs the sink on a thread of Py4J's callback server, where an exception Spark cannot catch would end
that thread alone and leave the query waiting for ever. So a batch whose transaction fails (Kafka away past
`transaction_timeout_s`, a wedged call, a refused record) only aborts it, or lets go of a producer that can
abort no more, and raises an ordinary exception: the query fails, and the job restarts it through
`resume()`, which makes the new producer on the job's main thread, however long Kafka stays away
(`KafkaStartupError` past the start-up deadline ends the process, and supervision starts it again).
"""
from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from pyspark.sql import DataFrame, SparkSession

from local_stream_buffer.clock import ClockCounters
from pipeline_core.kafka_clients import (DEFAULT_STARTUP_DEADLINE_S, REQUEST_TIMEOUT_MS, TRANSACTIONAL_CALL_TIMEOUT_S,
                                         KafkaCallWedged, admin_client, consumer_config, raise_partition_errors,
                                         retry_transient, transactional_producer_config)
from pipeline_core.spec_starts import read_starts, starts_now, with_starts, without_starts
from pipeline_core.topics import dead_letter_limit
from pipeline_core.transactional import TransactionalProducer

from .batch_records import produce_batch
from .bucket_join import CLOCK, unpack_emitted
from .checkpoint import checkpoint_query_id, offset_log_entry

log = logging.getLogger(__name__)

# Records the driver may queue while producing one batch before it has to wait for deliveries.
_QUEUE_MESSAGES = 1_000_000
# The default of how long one transactional call (offsets, commit, abort) may wait for Kafka.
DEFAULT_TRANSACTION_TIMEOUT_S = 60.0
# The committed offsets' metadata: the batch that committed them, and the checkpoint's query.
_BATCH_METADATA = re.compile(r"spark batch (\d+) of query (\S+)")
# Longest pause between two attempts of a transactional call Kafka answered with a retriable error at once; the
# transaction timeout bounds the attempts in all.
_MAX_RETRY_PAUSE_S = 1.0


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
    # Per machine, what the clock rule did in committed batches (local_stream_buffer.clock).
    clock_faults: dict[str, ClockCounters] = field(default_factory=dict)


class TransactionalBatchSink:
    """``foreachBatch`` function writing the processor's rows to machine.out / machine.dlq exactly once."""

    def __init__(self, bootstrap_servers: str, output_topic: str, dlq_topic: str, transactional_id: str,
                 startup_deadline_s: float = DEFAULT_STARTUP_DEADLINE_S,
                 security: Mapping[str, str] | None = None,
                 transaction_timeout_s: float = DEFAULT_TRANSACTION_TIMEOUT_S) -> None:
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
        # Each call is asked again up to the start-up deadline, the progress report between calls: one call's bound
        # stays short of the stale time, or the watchdog ends a driver that only waits for Kafka in `resume()`.
        self._request_timeout = min(REQUEST_TIMEOUT_MS / 1000, startup_deadline_s)
        self._startup_deadline_s = startup_deadline_s
        self._transaction_timeout_s = transaction_timeout_s
        # One call's bound: the transaction's retries go on up to its timeout, each call for at most this.
        self._call_timeout_s = min(transaction_timeout_s, TRANSACTIONAL_CALL_TIMEOUT_S)
        # Called while the job's main thread waits for Kafka in `resume()` (the progress report).
        self.while_waiting: Callable[[], object] | None = None
        # "Kafka" while a new producer cannot be made (the transactions' own waits are `_kafka`'s).
        self._waiting_to_start: str | None = None
        # Its producer is None after a failed transaction left it unable to go on: `resume()` makes the next one.
        # No `while_waiting` there: its calls run on Spark's batch thread, the progress report on the main one.
        self._kafka = TransactionalProducer(lambda: Producer(self._producer_config),
                                            call_timeout_s=self._call_timeout_s, max_retry_pause_s=_MAX_RETRY_PAUSE_S)
        self._initialise()
        # The committed input positions live in the group named like the transactional id; this consumer
        # never subscribes.
        self._group = Consumer(consumer_config(bootstrap_servers, transactional_id, **(security or {})))
        self._group_id = transactional_id
        self.input_topic = ""
        self.offset_log = ""  # the checkpoint's offset log: where each batch's input ends
        self.committed: dict[int, int] = {}  # input partition -> offset up to which the outputs are in Kafka
        # The join specs run (by fingerprint), and where each started per input partition (pipeline_core.spec_starts):
        # read at resume(), named in every commit's metadata.
        self.fingerprints: list[str] = []
        self.spec_starts: dict[int, dict[str, int]] = {}
        self.checkpoint_dir = ""
        self.query_id: str | None = None  # the checkpoint's query, once it has run
        self.last_batch_committed = -1  # of this checkpoint's query: the last batch whose transaction committed
        self.counters = SinkCounters()
        # The processor's letters are under machine.dlq's default limit; a DLQ topic made with a lower one would
        # refuse larger letters and fail every batch holding one.
        self.dead_letter_max_bytes = dead_letter_limit(admin_client(bootstrap_servers, **(security or {})), dlq_topic,
                                                       startup_deadline_s)

    @property
    def producer(self) -> Producer | None:
        return self._kafka.producer

    @property
    def waiting_for(self) -> str | None:
        """"Kafka" while a transaction waits for it or a new producer cannot be made: the heartbeat says stuck."""
        return self._waiting_to_start or self._kafka.waiting_for

    def _initialise(self) -> None:
        """The new producer's init, which fences an earlier one of the same transactional id (a crashed driver's, or
        a wedged one of this process) and aborts what that left open; waits for Kafka up to the start-up deadline."""
        producer = self._kafka.producer
        retry_transient(lambda: producer.init_transactions(self._request_timeout), deadline_s=self._startup_deadline_s,
                        what=f"initialising the sink's transactions ({self._producer_config['transactional.id']})",
                        while_waiting=self._waiting_for_kafka)

    def _waiting_for_kafka(self) -> None:
        self._waiting_to_start = "Kafka"
        if self.while_waiting is not None:
            self.while_waiting()

    def resume(self, input_topic: str, checkpoint_dir: str, fingerprints: list[str] | None = None) -> dict[int, int]:
        """Before a query starts on ``checkpoint_dir``: read the committed input position of every partition
        of ``input_topic`` (partition -> offset; absent where nothing is committed) and return it, and where each
        of the join specs run (`fingerprints`) started in each (`spec_starts`: a spec added since starts at the
        committed offset). After a
        transaction that failed for good it first makes a new producer, which fences the old one and aborts what
        that left open. Either waits for Kafka up to the start-up deadline, then raises `KafkaStartupError`."""
        self.input_topic = input_topic
        self.fingerprints = list(fingerprints or [])
        self.spec_starts = {}
        self.offset_log = f"{checkpoint_dir.rstrip('/')}/offsets"
        self.checkpoint_dir = checkpoint_dir
        self.query_id = checkpoint_query_id(checkpoint_dir)
        self.last_batch_committed = -1
        if self.producer is None:
            log.warning("making a new transactional producer: it fences the one a failed batch left and aborts "
                        "its open transaction")
            self._kafka.renew(self._initialise)
        self.committed = retry_transient(self._committed_input, deadline_s=self._startup_deadline_s,
                                         what=f"reading the sink's committed input (group {self._group_id})",
                                         while_waiting=self._waiting_for_kafka)
        self._waiting_to_start = None
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
            named = _BATCH_METADATA.fullmatch(without_starts(position.metadata))
            if named is not None and named.group(2) == self.query_id:
                self.last_batch_committed = max(self.last_batch_committed, int(named.group(1)))
            _low, high = self._group.get_watermark_offsets(position, timeout=self._request_timeout)
            if position.offset > high:
                # Offsets never shrink: the topic was deleted and created again, and its outputs begin anew.
                log.warning("%s [%d] ends at %d, before the outputs' committed input offset %d: the topic was "
                            "recreated; its records are joined as new", self.input_topic, position.partition, high,
                            position.offset)
                continue
            positions[position.partition] = position.offset
            self.spec_starts[position.partition] = starts_now(read_starts(position.metadata), self.fingerprints,
                                                              position.offset)
        return positions

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        began = time.monotonic()
        ends = self._batch_ends(batch.sparkSession, batch_id)
        if batch_id == 0 and self.committed:
            self._rebuilding()
        if self.query_id is None:
            self.query_id = checkpoint_query_id(self.checkpoint_dir)  # written when the query first started
        # Always run the batch: it is what stores the join state, also where all its outputs are dropped.
        rows = unpack_emitted(batch.toArrow().column("records").to_pylist())
        self.counters.compute_seconds += time.monotonic() - began
        self.write(batch_id, rows, ends)

    def write(self, batch_id: int, rows: pa.Table, ends: Mapping[int, int]) -> None:
        """Commit batch ``batch_id``'s processor rows with its input ``ends`` (partition -> offset) in one
        transaction, or nothing of it: a failure aborts the transaction (or lets go of a producer that cannot
        abort) and raises, and Spark runs the batch again after `resume()`."""
        began = time.monotonic()
        if batch_id <= self.last_batch_committed:
            self.counters.skipped_batches += 1
            log.info("batch %d: committed before (a batch run again after a crash): state only", batch_id)
            return
        advanced = {partition: end for partition, end in ends.items() if end > self.committed.get(partition, -1)}
        if not advanced and not rows.num_rows:
            self.counters.skipped_batches += 1
            log.info("batch %d: its input was committed before (a replayed or rebuilt batch): state only", batch_id)
            return
        producer = self.producer
        if producer is None:
            raise RuntimeError(f"batch {batch_id}: the sink let go of its producer after a failed transaction; "
                               "the query restarts, and resume() makes a new one")
        is_clock = pc.equal(rows.column("kind"), CLOCK)
        clock_rows = rows.filter(is_clock).column("value").to_pylist()
        rows = rows.filter(pc.invert(is_clock))
        try:
            producer.begin_transaction()
            dead_letters = produce_batch(producer, rows, self.output_topic, self.dlq_topic, self.dead_letter_max_bytes)
            # Every partition of the batch, advanced or not: the metadata names the batch (see the module doc).
            named = f"spark batch {batch_id} of query {self.query_id}" if self.query_id else f"spark batch {batch_id}"
            positions = [TopicPartition(self.input_topic, partition, max(end, self.committed.get(partition, end)),
                                        self._with_starts(named, partition))
                         for partition, end in sorted(ends.items())]
            # Each call asked again while Kafka answers a retriable error, for at most the transaction timeout in all.
            deadline = time.monotonic() + self._transaction_timeout_s
            if positions:
                metadata = self._group.consumer_group_metadata()
                self._kafka.until_done(lambda producer: producer.send_offsets_to_transaction(
                    positions, metadata, self._call_timeout_s), f"committing batch {batch_id}'s input offsets",
                    deadline=deadline)
            self._kafka.until_done(lambda producer: producer.commit_transaction(self._call_timeout_s),
                                   f"committing batch {batch_id}", deadline=deadline)
        except BaseException as failure:
            # Whatever failed (Kafka away, a record the producer refused, an interrupt), nothing of the batch may
            # commit: Spark runs it again.
            self._abandon(batch_id, failure)
            raise
        finally:
            self._kafka.waiting_for = None
        self.committed.update(advanced)
        self.last_batch_committed = batch_id
        counters = self.counters
        counters.batches += 1
        counters.joins += rows.num_rows - dead_letters
        counters.dead_letters += dead_letters
        counters.last_batch_id = batch_id
        for counts in clock_rows:
            for thing, faults in json.loads(counts).items():
                counters.clock_faults.setdefault(thing, ClockCounters()).add(ClockCounters(*faults))
        counters.produce_seconds += time.monotonic() - began
        log.debug("batch %d: %d records produced and committed in %.2f s", batch_id, rows.num_rows,
                  time.monotonic() - began)

    def _abandon(self, batch_id: int, failure: BaseException) -> None:
        """Abort the failed batch's transaction. A producer whose call is still wedged, or whose abort Kafka
        refused or did not answer, can do no more: the sink lets go of it, and `resume()` makes a new one, which
        fences it and aborts its transaction."""
        if not isinstance(failure, KafkaCallWedged):
            try:
                self._kafka.call(lambda producer: producer.abort_transaction(self._call_timeout_s),
                                 f"aborting batch {batch_id}")
                log.warning("batch %d failed and was aborted (Spark runs it again): %s", batch_id, failure)
                return
            except (KafkaException, KafkaCallWedged) as error:
                log.warning("batch %d failed (%s) and its abort too: %s", batch_id, failure, error)
        log.warning("batch %d: letting go of the transactional producer; the query restarts and a new producer "
                    "aborts the open transaction (%s)", batch_id, failure)
        self._kafka.let_go()

    def _with_starts(self, metadata: str, partition: int) -> str:
        """A commit's metadata with where each spec started in `partition` (all at its beginning where nothing was
        committed before this run)."""
        if not self.fingerprints:
            return metadata
        return with_starts(metadata, self.spec_starts.get(partition) or {fingerprint: 0
                                                                        for fingerprint in self.fingerprints})

    def _batch_ends(self, spark: SparkSession, batch_id: int) -> dict[int, int]:
        """Where batch ``batch_id``'s input ends in each partition: its entry in the checkpoint's offset log."""
        if not self.offset_log:
            raise RuntimeError("the sink runs a query that was started without resume()")
        return batch_ends(offset_log_entry(spark, self.offset_log, batch_id), self.input_topic)

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
