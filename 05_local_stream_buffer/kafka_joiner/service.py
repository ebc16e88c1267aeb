"""The consume-join-produce loop: exactly once, join state included, through crashes and rebalances.

One consumer and one transactional producer per instance. Each round consumes a batch, joins it inside
the open transaction, and commits when the transaction is due. A transaction carries, atomically:

* input records forwarded to the co-partitioned topic, and the input offsets they came from (input
  partitioned by key, see `repartition`);
* join outputs and dead letters, what changed in the records the joins hold (to the compacted changelog,
  see `changelog`), and per co-partitioned partition the processed position (see `partition_join`).

A revocation commits the open transaction first; a lost assignment or an exception aborts it; an aborted
commit goes back to the last one (`rebalance`). KIP-447 fencing keeps a zombie instance from committing after its
partitions moved.
"""
from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from pipeline_core.data_loss import OffsetWatch
from pipeline_core.group_watch import ConsumerWedged, GroupWatch, end_wedged_process
from pipeline_core.kafka_clients import (admin_client, is_fatal, produce, retry_transient,
                                         security_config)
from pipeline_core.lifecycle import StopSignal
from pipeline_core.progress import ProgressReporter

from local_stream_buffer.specs import SpecResolver, load_join_specs
from .alignment import InputAlignment
from .assembly import assemble
from .changelog import Restorer
from .clients import joiner_consumer, joiner_producer
from .growth import GrowthFollower, produced
from .partition_join import FrameJoiner
from .progress import LABELS, JoinerObservation, JoinerStats
from .rebalance import OwnedPartitions
from .repartition import Forwarder
from .settings import KafkaJoinerSettings
from .transaction import KAFKA_TIMEOUT_S, Transaction

log = logging.getLogger(__name__)

# Messages per consume() call: bounds one call's work (frames hold up to as many records). Public: the
# benchmarks measure a plain consumer with the same batch and wait.
CONSUME_BATCH = 500
# How long consume() waits for a full batch. A live stream never fills one, so each round waits this out
# before it commits, and every hop's latency pays it (figures in the package README). Returning on the
# first message instead committed a transaction per handful of records, whose overhead made it worse.
POLL_TIMEOUT_S = 0.005


class KafkaJoiner:
    """The standalone exactly-once joiner: machine.data -> keyed join -> machine.out (+ machine.dlq)."""

    def __init__(self, settings: KafkaJoinerSettings, stop: StopSignal | None = None) -> None:
        self.settings = settings
        self.stop = stop or StopSignal()
        self.resolver = SpecResolver(load_join_specs(settings.join_specs))
        # A join spec with idle_release_s: each round looks for quiet streams to release.
        self._releases_idle = any(spec.idle_release_s is not None for spec in self.resolver.specs)
        self.instance_id = settings.instance_id or uuid.uuid4().hex[:12]
        self.transactional_id = f"{settings.transactional_id_prefix}.{self.instance_id}"
        self._by_thing = settings.input_partitioned_by_thing
        # The topic whose partitions hold the joins: where every quantity of a thing lies in one partition.
        self.join_topic = settings.input_topic if self._by_thing else settings.repartition_topic_name()
        self.state_topic = settings.state_topic_name()
        self.stats = JoinerStats()
        self._progress = ProgressReporter.for_stage(
            "kafka_joiner", self.stats, settings, logger=log, labels=LABELS, progress_counters=("transactions",),
            observe=JoinerObservation(self.stats, lambda: self._partitions.figures() if self._partitions is not None else None,
                                      log, lambda: self._transaction.waiting_for))
        self._group_watch = GroupWatch.asking(
            settings.group_id, lambda: admin_client(settings.kafka_bootstrap_servers, **security_config(settings)))
        self._consumer = joiner_consumer(settings, self._group_watch.on_statistics)
        self._watch = OffsetWatch(self._consumer, self.stats, log)
        self._transaction = Transaction(
            lambda: joiner_producer(settings, self.transactional_id), self._consumer, self.stats,
            settings.commit_interval_ms / 1000, settings.max_transaction_records,
            while_waiting=self._progress.maybe_report, stopping=self.stop.is_set)
        # Set up by start(), once the partition counts are known.
        self._forwarder: Forwarder | None = None
        self._alignment: InputAlignment | None = None
        self._partitions: OwnedPartitions | None = None
        self._frames: FrameJoiner | None = None
        self._restorer: Restorer | None = None
        # Input partitioned by thing: the internal topics and the joins follow a grown input (`growth`).
        self._growth: GrowthFollower | None = None

    # -- life cycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Create the joiner's topics and parts (`assembly`), fence earlier runs of this transactional id, join the
        group."""
        settings = self.settings
        deadline_s = settings.kafka_startup_deadline_s
        parts = assemble(settings, self.resolver, self.stats, self._consumer, self._transaction, self._watch,
                         self._commit, join_topic=self.join_topic, state_topic=self.state_topic,
                         by_thing=self._by_thing)
        self._restorer, self._partitions, self._frames = parts.restorer, parts.partitions, parts.frames
        self._forwarder, self._alignment, self._growth = parts.forwarder, parts.alignment, parts.growth
        # Before joining the group: aborts the open transaction of a crashed run with this transactional id,
        # whose pending offsets would otherwise hold up reading the committed ones. A just started broker
        # answers it with NOT_COORDINATOR while it creates __transaction_state.
        retry_transient(lambda: self._transaction.initialise(min(KAFKA_TIMEOUT_S, deadline_s)),
                        what=f"initialising transactions ({self.transactional_id})", deadline_s=deadline_s)
        self._consumer.subscribe(sorted({settings.input_topic, self.join_topic}),
                                 on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost)
        log.info("joining %s into %s (dlq %s) as %s in group %s, %s", settings.input_topic, settings.output_topic,
                 settings.dlq_topic, self.transactional_id, settings.group_id,
                 "where each record lies (partitioned by thing)" if self._by_thing else f"via {self.join_topic}")
        log.info("join state in %s", self.state_topic)

    def run(self, until: Callable[[KafkaJoiner], bool] | None = None) -> None:
        """Consume, join and commit until `stop` is set (or until `until(self)` holds), then commit and leave.
        An exception aborts the open transaction instead: it may hold a batch joined halfway."""
        completed = False
        try:
            while not self.stop.is_set():
                self.step()
                self._group_watch.check()
                if until is not None and until(self):
                    break
            completed = True
        except ConsumerWedged as wedged:
            end_wedged_process(wedged, self._progress.close)  # does not return: the consumer's close would wait
        finally:
            self.close(commit=completed)

    def close(self, commit: bool = True) -> None:
        """Commit what is done (`commit`, after a clean stop) or abort the open transaction (after an
        exception), and leave the group. Nothing is left to flush: every record went into the transaction,
        which the commit flushed or the abort purged (and a producer whose abort Kafka refused is in a fatal
        state, where a flush raises)."""
        try:
            if self._transaction.open:
                if commit:
                    self._commit(rewind_on_abort=False)
                else:
                    self._transaction.abort_on_exit()
        finally:
            try:
                self._progress.close()  # its last report measures the lag with the consumer: before that closes
            finally:
                self._consumer.close()
                if self._restorer is not None:
                    self._restorer.close()
                if self._growth is not None:
                    self._growth.close()
        log.info("stopped")

    # -- the loop --------------------------------------------------------------------------------------

    def step(self) -> None:
        """One round: consume a batch, join it in the open transaction, commit when due, report when due."""
        changes = self._partitions.changes
        messages = self._consumer.consume(CONSUME_BATCH, self._transaction.wait_s(POLL_TIMEOUT_S))
        if self._partitions.changes != changes:
            # A rebalance ran inside consume(): messages of this batch may predate it. Its errors still count: one may
            # say why it ran (a topic deleted).
            self._partitions.reposition()
            for message in messages:
                if message.error() is not None:
                    self._message_error(message)
            messages = []
        if messages:
            self._process(messages)
        if self._growth is not None:
            self._growth.step()
        if self._releases_idle:
            self._frames.release_idle(self._partitions.joins)
        if self._alignment is not None and (messages or self._alignment.paused):
            # Also without input while partitions are paused: the partition they wait for may have turned
            # out empty, and only this resumes them.
            self._alignment.align()
        # A short batch means the consumer waited for input: nothing is queued, so commit now instead of
        # at the interval. Each hop (input -> co-partitioned topic -> output) then costs one commit, not an
        # interval, while a backlog still commits by interval or size.
        if self._transaction.open and (len(messages) < CONSUME_BATCH or self._transaction.due()):
            self._commit()
        self._progress.maybe_report()

    def _process(self, messages: list[Message]) -> None:
        """Transform a batch inside the open transaction (begun here), committing midway when it is due."""
        if self.stats.first_record_at is None:
            self.stats.first_record_at = time.monotonic()
        consumed = []
        for message in messages:
            error = message.error()
            if error is None:
                consumed.append(message)
            else:
                self._message_error(message)
        if not consumed:
            return
        self._watch.consumed(consumed)
        if not self._transaction.open:
            self._transaction.begin()
        frames = consumed
        if self._forwarder is not None:
            # Stage one (input partitioned by key): forward each joinable input record to its thing's partition.
            frames = self._forwarder.forward(consumed)
            self._transaction.records += len(consumed) - len(frames)
        # Stage two: join the frames of the co-partitioned topic in the partition each lies in. Frames can be
        # large: the transaction commits between them once due, so none outlives its interval by much.
        while frames:
            frames = frames[self._frames.join(frames, self._partitions.joins):]
            if frames:
                if not self._commit():
                    return  # aborted: the rest of this batch is read again from the last commit
                self._transaction.begin()
        if self._forwarder is not None:
            self._forwarder.flush(self._produce_frame)

    def _produce_frame(self, partition: int, frame: bytes) -> None:
        produced(produce(self._transaction.producer, self.join_topic, frame, None, partition=partition))

    def _produce_state(self, partition: int, key: bytes, value: bytes | None) -> None:
        produced(produce(self._transaction.producer, self.state_topic, value, key, partition=partition))

    def _commit(self, rewind_on_abort: bool = True) -> bool:
        """Commit outputs, dead letters, forwarded records, state changes and positions together; on abort go
        back to the last commit (unless the partitions are being handed over). False if it aborted."""
        if self._forwarder is not None:
            self._forwarder.flush(self._produce_frame)
        self._partitions.flush_state(self._produce_state, self._frames.produce_dead_letter)
        if self._transaction.commit(self._offsets()):
            return True
        if rewind_on_abort:
            # The aborted outputs are gone and the state has moved past them: restart every owned partition
            # from its last commit, exactly as after an assignment.
            self._partitions.reload()
            if self._growth is not None:  # what it handed over or asked for went with the transaction
                self._growth.reset()
        return False

    def _offsets(self) -> list[TopicPartition]:
        offsets = []
        if self._forwarder is not None:
            offsets = [TopicPartition(self.settings.input_topic, partition, offset)
                       for partition, offset in self._forwarder.positions.items()]
        for join in self._partitions.joins.values():
            position = join.commit_position()
            if position is not None:
                offsets.append(position)
        if self._growth is not None:
            offsets.extend(self._growth.positions())
        return offsets

    def _message_error(self, message: Message) -> None:
        error = message.error()
        if not self._watch.consumer_error(error, message.topic()):
            self._consumer_error(error)

    def _consumer_error(self, error: KafkaError) -> None:
        # The consumer serves nothing any more: the joiner exits (and is restarted) instead of turning idle forever.
        if is_fatal(error):
            raise KafkaException(error)
        log.warning("consumer: %s", error)

    # -- rebalancing: the open transaction is committed before partitions go, and aborted if they are lost --

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._growth is not None:
            self._growth.assign(partitions)
        self._partitions.assign(partitions)
        if self._growth is not None:
            self._growth.assigned(partitions)

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._transaction.open:
            self._commit(rewind_on_abort=False)
        self._partitions.revoke(partitions)
        if self._growth is not None:
            self._growth.revoke(partitions)

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # The group has moved on: nothing of the open transaction may commit any more.
        if self._transaction.open:
            self._transaction.abort()
        self._partitions.revoke(partitions, lost=True)
        if self._growth is not None:
            self._growth.revoke(partitions)

    # -- reporting -------------------------------------------------------------------------------------

    def assigned(self) -> bool:
        """True once this instance owns partitions of both topics (after joining the group)."""
        return bool(self._partitions and self._partitions.joins and self._partitions.owned)

    def forced(self) -> int:
        """Pending records forced out by the pending limit in the owned partitions' joins."""
        return self._partitions.forced() if self._partitions is not None else 0
