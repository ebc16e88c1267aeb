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
from confluent_kafka.admin import NewPartitions

from pipeline_core.records import InvalidRecord, decode_record

from pipeline_core.broker_offsets import BrokerOffsets
from pipeline_core.consumer_lag import REPORT_REQUEST_TIMEOUT_S
from pipeline_core.data_loss import OffsetWatch
from pipeline_core.group_watch import ConsumerWedged, GroupWatch, end_wedged_process
from pipeline_core.kafka_clients import (KafkaCallWedged, admin_client, is_fatal, produce, retry_transient,
                                         security_config)
from pipeline_core.lifecycle import StopSignal
from pipeline_core.progress import ProgressReporter
from pipeline_core.records import DLQ_MAX_MESSAGE_BYTES
from pipeline_core.topics import MACHINE_DATA, TopicSpec, dead_letter_limit, ensure_topics, partition_count

from local_stream_buffer.keyed import KeyedJoiner
from local_stream_buffer.spec_changes import fingerprints
from local_stream_buffer.specs import SpecResolver, load_join_specs
from .alignment import InputAlignment
from .changelog import (CLOCK_PREFIX, STATE_TOPIC_CONFIG, Restorer, adopted_key, adopted_position, decode_clock,
                        decode_release)
from .handover import HANDOVER_TOPIC_CONFIG, Done, Handover, Pending, Request, handover_topic_name, moved_clock
from .clients import joiner_consumer, joiner_producer
from .partition_join import FrameJoiner
from .progress import LABELS, JoinerObservation, JoinerStats
from .rebalance import OwnedPartitions
from .repartition import Forwarder, InputFrames, ThingRouter, repartitioned_frame
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
        # Input partitioned by thing: the join of a thing whose records moved to another partition after the input
        # grew follows them (`handover`); the partition counts the input is known to have had, and its
        # internal topics' count.
        self._handover: Handover | None = None
        self._admin = None
        self._counts: list[int] = []
        self._internal_partitions = 0

    # -- life cycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Create the co-partitioned topic (unless the input is one) and the state topic, fence earlier runs of
        this transactional id, join the group."""
        settings = self.settings
        admin = admin_client(settings.kafka_bootstrap_servers, **security_config(settings))
        deadline_s = settings.kafka_startup_deadline_s
        input_partitions = partition_count(admin, settings.input_topic, deadline_s)
        if self._by_thing:
            join_partitions = input_partitions
        else:
            # Frames of records as large as the input's limit: the topic takes what the producer sends.
            ensure_topics(admin, (TopicSpec(self.join_topic, input_partitions, {
                **MACHINE_DATA.config, "max.message.bytes": str(DLQ_MAX_MESSAGE_BYTES)}),), deadline_s=deadline_s)
            join_partitions = partition_count(admin, self.join_topic, deadline_s)  # an existing topic may differ
        ensure_topics(admin, (TopicSpec(self.state_topic, join_partitions, STATE_TOPIC_CONFIG),), deadline_s=deadline_s)
        state_partitions = partition_count(admin, self.state_topic, deadline_s)
        if state_partitions < join_partitions and self._by_thing:
            state_partitions = self._grow_internal(admin, state_partitions, join_partitions, deadline_s)
        if state_partitions != join_partitions:
            raise SystemExit(f"state topic {self.state_topic} has {state_partitions} partitions, {self.join_topic} "
                             f"{join_partitions}: they must match (see --state-topic)")
        self._admin = admin
        self._counts = [join_partitions]
        self._internal_partitions = join_partitions
        router = ThingRouter(self.resolver, join_partitions)
        if self._by_thing:
            frame_of = InputFrames(router, self.stats).frame
            handover_topic = handover_topic_name(self.state_topic)
            ensure_topics(admin, (TopicSpec(handover_topic, join_partitions, HANDOVER_TOPIC_CONFIG),),
                          deadline_s=deadline_s)
            if partition_count(admin, handover_topic, deadline_s) < join_partitions:
                self._grow_internal(admin, join_partitions - 1, join_partitions, deadline_s)
            self._handover = Handover(settings.kafka_bootstrap_servers, settings.group_id, handover_topic,
                                      settings.input_topic, self.resolver.joinable_thing, security_config(settings))
        else:
            frame_of = repartitioned_frame
            self._forwarder = Forwarder(settings.input_topic, router, self.stats)
            self._alignment = InputAlignment(
                self._consumer, settings.input_topic, settings.align_ms, self._forwarder.positions,
                self._forwarder.append_times, lambda: self._partitions.starts())
        self._restorer = Restorer(settings.kafka_bootstrap_servers, settings.group_id, self.state_topic,
                                  security_config(settings))
        self._partitions = OwnedPartitions(
            self._consumer, self.join_topic,
            lambda on_release, on_evict, on_dead_letter, specs=None: KeyedJoiner(
                self.resolver if specs is None else SpecResolver(specs),
                max_pending_per_side=settings.max_pending_per_side, on_release=on_release,
                max_join_keys=settings.max_join_keys or None, on_evict=on_evict, on_dead_letter=on_dead_letter),
            self._restorer, self.stats, self._forwarder, self._alignment, self._watch,
            broker_offsets=BrokerOffsets(settings.kafka_bootstrap_servers, REPORT_REQUEST_TIMEOUT_S,
                                         security=security_config(settings)),
            specs=fingerprints(self.resolver.specs))
        self._frames = FrameJoiner(self._transaction, self.stats, settings.input_topic,
                                   settings.output_topic, settings.dlq_topic, frame_of, join_partitions,
                                   dead_letter_limit(admin, settings.dlq_topic, deadline_s))
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
                    self._abort_after_failure()
        finally:
            try:
                self._progress.close()  # its last report measures the lag with the consumer: before that closes
            finally:
                self._consumer.close()
                if self._restorer is not None:
                    self._restorer.close()
                if self._handover is not None:
                    self._handover.close()
        log.info("stopped")

    def _abort_after_failure(self) -> None:
        # Outputs and state changes of records whose positions were not yet counted would commit with stale
        # offsets: on restart those records would meet their own state again (out_of_order dead letters).
        try:
            self._transaction.abort(replace_on_failure=False)
        except (KafkaException, KafkaCallWedged) as error:
            # Fenced, the broker gone, or the abort refused (INVALID_TXN_STATE right after a produce, librdkafka
            # issue 4849): the broker aborts the transaction itself (at once when this instance id restarts, else
            # after the transaction timeout); nothing of it ever commits.
            log.warning("could not abort the open transaction after a failure: %s", error)

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
        if self._handover is not None:
            self._handover_step()
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
        _produced(produce(self._transaction.producer, self.join_topic, frame, None, partition=partition))

    def _produce_state(self, partition: int, key: bytes, value: bytes | None) -> None:
        _produced(produce(self._transaction.producer, self.state_topic, value, key, partition=partition))

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
            if self._handover is not None:  # what it handed over or asked for went with the transaction
                self._handover.reset(self._handover_committed(list(self._handover.partitions)))
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
        if self._handover is not None:
            offsets.extend(self._handover.positions())
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
        if self._by_thing:
            self._follow_growth(partitions)
        self._partitions.assign(partitions)
        if self._handover is not None:
            self._handover.assign(self._handover_committed([p.partition for p in partitions]))

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._transaction.open:
            self._commit(rewind_on_abort=False)
        self._partitions.revoke(partitions)
        if self._handover is not None:
            self._handover.revoke(p.partition for p in partitions if p.topic == self.join_topic)

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # The group has moved on: nothing of the open transaction may commit any more.
        if self._transaction.open:
            self._transaction.abort()
        self._partitions.revoke(partitions, lost=True)
        if self._handover is not None:
            self._handover.revoke(p.partition for p in partitions if p.topic == self.join_topic)

    # -- the input grew (input partitioned by thing): internal topics follow, and joins follow their things --

    def _follow_growth(self, partitions: list[TopicPartition]) -> None:
        """Partitions beyond the internal topics' count were assigned: the input grew. The changelog and the
        handover topic get as many partitions (before any of them is restored), and records are judged by the new
        count too."""
        highest = max((p.partition for p in partitions if p.topic == self.join_topic), default=-1)
        if highest < self._internal_partitions:
            return
        deadline_s = self.settings.kafka_startup_deadline_s
        count = partition_count(self._admin, self.join_topic, deadline_s)
        self._internal_partitions = self._grow_internal(self._admin, self._internal_partitions, count, deadline_s)
        self._producer_knows(count)  # the state of the new partitions goes to their changelog partitions
        if count not in self._counts:
            self._counts.append(count)
            self._frames.counts = tuple(self._counts)

    def _grow_internal(self, admin, before: int, count: int, deadline_s: float) -> int:
        """Give the changelog and the handover topic `count` partitions (each grown, if it has fewer), and wait
        until Kafka says so; returns `count`."""
        topics = [self.state_topic] + ([handover_topic_name(self.state_topic)] if self._by_thing else [])
        for topic in topics:
            have = partition_count(admin, topic, deadline_s)
            if have >= count:
                continue
            (future,) = admin.create_partitions([NewPartitions(topic, count)],
                                                 request_timeout=min(30.0, deadline_s)).values()
            try:
                future.result()
            except KafkaException as error:
                if error.args[0].code() != KafkaError.INVALID_PARTITIONS:  # another instance grew it first
                    raise
            retry_transient(lambda topic=topic: _at_least(partition_count(admin, topic, deadline_s), count, topic),
                            what=f"waiting for {topic} to show {count} partitions", deadline_s=deadline_s)
            log.info("%s grew from %d to %d partitions, as %s did", topic, have, count, self.join_topic)
        return count

    def _handover_committed(self, partitions: list[int]) -> list[TopicPartition]:
        if not partitions:
            return []
        return self._consumer.committed([TopicPartition(self._handover.topic, partition) for partition in partitions],
                                        timeout=KAFKA_TIMEOUT_S)

    def _handover_step(self) -> None:
        """Read the handover topic; ask for the things stopped partitions wait for; hand over what is due;
        go on with partitions whose things came (`handover`)."""
        handover = self._handover
        joins = self._partitions.joins
        for partition, offset, message in handover.poll():
            join = joins.get(partition)
            if join is None:
                continue
            if isinstance(message, Request):
                start = join.position if join.position is not None else join.committed
                handover.partitions[partition].pending.append(
                    Pending(offset, message, handover.last_unread(partition, start, message)))
            else:
                self._answered(join, message)
        for join in joins.values():
            if join.stopped_at is not None:
                self._partitions.stop(join.partition)
            for thing, awaited in join.awaiting.items():
                if not awaited.requested:
                    self._ask(join, thing, awaited)
        for partition, state in list(handover.partitions.items()):
            join = joins.get(partition)
            if join is None:
                continue
            # Read past every record of the thing placed here: a partition stopped for a thing of its own reads on
            # only past records written after those (see `handover`), so it still answers.
            reached = join.position if join.position is not None else (join.committed or 0)
            due = [pending for pending in state.pending if pending.last is None or reached > pending.last]
            if due:
                self._hand_over(join, due)
        for join in list(joins.values()):
            if join.stopped_at is not None and not join.awaiting:
                self._go_on(join)

    def _ask(self, join, thing: str, awaited) -> None:
        if not self._transaction.open:
            self._transaction.begin()
        home = awaited.homes.pop(0)
        request = Request(thing, join.partition, awaited.at, awaited.counts)
        _produced(produce(self._transaction.producer, self._handover.topic, request.encode(),
                                     thing.encode(), partition=home))
        awaited.requested = True
        self._handover.requests_sent += 1
        log.info("%s [%d]: %s was placed in partition %d before the input grew; asking for its join state",
                 self.join_topic, join.partition, thing, home)

    def _answered(self, join, done: Done) -> None:
        awaited = join.awaiting.get(done.thing)
        if awaited is None or not awaited.requested:
            return  # an answer to a request asked again (after a restart): already settled
        if not done.found and awaited.homes:
            awaited.requested = False  # asked next where it lay under a count before
            return
        # Restored from the changelog before the partition goes on, found or not: an answer to an earlier request
        # (before this instance's restore of the partition, say) may have written the thing's records there.
        join.adopting = True
        join.known.add(done.thing)
        del join.awaiting[done.thing]

    def _hand_over(self, join, due: list) -> None:
        """Give the things of `due` requests to the partitions that asked: their held records go to those
        partitions' changelog as adopted records (their release and clock records as they are, a clock record naming
        each held record by its place there), and leave this one's, in one transaction with the answers."""
        if self._transaction.open and not self._commit():
            return
        partition = join.partition
        held, _read = self._restorer.restore([partition])
        keyed = self._restorer.releases.get(partition, [])  # release and clock records, by their join key
        things = {pending.request.thing for pending in due}
        moving: dict[str, list] = {thing: [] for thing in things}
        moving_keyed: dict[str, list] = {thing: [] for thing in things}
        kept, kept_keyed = [], []
        for record in held.get(partition, []):
            thing = _thing_of(record.value)
            (moving[thing] if thing in things else kept).append(record)
        for record in keyed:
            thing = _keyed_thing(record)
            (moving_keyed[thing] if thing in things else kept_keyed).append(record)
        self._producer_knows(max(pending.request.to for pending in due) + 1)
        self._transaction.begin()
        producer = self._transaction.producer
        for pending in due:
            request = pending.request
            records, keyed_records = moving.get(request.thing, []), moving_keyed.get(request.thing, [])
            places = {}  # a record's place here -> its place there
            for index, record in enumerate(records):
                places[record.position] = adopted_position(request.at, index)
                _produced(produce(producer, self.state_topic, record.value,
                                  adopted_key(request.at, index, join.feeds(record)), partition=request.to))
            for record in keyed_records:
                value = record.value
                if record.key.startswith(CLOCK_PREFIX):
                    value = moved_clock(record.key, value, places)
                _produced(produce(producer, self.state_topic, value, record.key, partition=request.to))
            for record in (*records, *keyed_records):
                _produced(produce(producer, self.state_topic, None, record.key, partition=partition))
            _produced(produce(producer, self._handover.topic,
                              Done(request.thing, partition, bool(records or keyed_records)).encode(),
                              request.thing.encode(), partition=request.to))
            self._handover.partitions[partition].pending.remove(pending)
            moving[request.thing], moving_keyed[request.thing] = [], []  # a thing asked for twice goes once
            if records or keyed_records:
                self._handover.handed_over += 1
                log.info("%s [%d]: handed the join state of %s (%d records) over to partition %d", self.join_topic,
                         partition, request.thing, len(records) + len(keyed_records), request.to)
        join.replace_state(kept, self.state_topic, kept_keyed)
        self._commit()

    def _producer_knows(self, partitions: int) -> None:
        """Wait until the producer's metadata holds `partitions` partitions of the changelog and the handover topic:
        another instance may have grown them, and a producer learns of new partitions only at its next refresh."""
        producer = self._transaction.producer
        for topic in (self.state_topic, self._handover.topic):
            retry_transient(lambda topic=topic: _at_least(
                len(producer.list_topics(topic, timeout=KAFKA_TIMEOUT_S).topics[topic].partitions), partitions, topic),
                what=f"learning of {partitions} partitions of {topic}",
                deadline_s=self.settings.kafka_startup_deadline_s)

    def _go_on(self, join) -> None:
        """A stopped partition has every thing it waited for: its join takes the adopted ones from its changelog,
        and it reads on from where it stopped."""
        if join.adopting:
            if self._transaction.open and not self._commit():
                return
            held, _read = self._restorer.restore([join.partition])
            join.replace_state(held.get(join.partition, []), self.state_topic,
                               self._restorer.releases.get(join.partition, []))
            join.adopting = False
        join.stopped_at = None
        self._partitions.go_on(join.partition)

    # -- reporting -------------------------------------------------------------------------------------

    def assigned(self) -> bool:
        """True once this instance owns partitions of both topics (after joining the group)."""
        return bool(self._partitions and self._partitions.joins and self._partitions.owned)

    def forced(self) -> int:
        """Pending records forced out by the pending limit in the owned partitions' joins."""
        return self._partitions.forced() if self._partitions is not None else 0


def _at_least(have: int, count: int, topic: str) -> int:
    if have < count:
        raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION, f"{topic} shows {have} partitions yet"))
    return have


def _keyed_thing(record) -> str | None:
    """The thing of a release or clock record (None: none it names)."""
    try:
        if record.key.startswith(CLOCK_PREFIX):
            return decode_clock(record.key, record.value)[0]
        return decode_release(record.key, record.value).thing
    except ValueError:
        return None


def _thing_of(value: bytes | None) -> str | None:
    try:
        thing = decode_record(value)["thing"]
    except InvalidRecord:
        return None
    return thing if isinstance(thing, str) else None


def _produced(refused: KafkaError | None) -> None:
    """Frames (bounded by `repartition.FRAME_MAX_BYTES`) and state records (input records) are never larger
    than the producer takes; should it refuse one, the transaction must not commit without it."""
    if refused is not None:
        raise KafkaException(refused)
