"""The consume-join-produce loop: exactly once, join state included, through crashes and rebalances.

One consumer (subscribed to the input topic and the internal co-partitioned topic) and one transactional
producer per instance. Every transaction carries, atomically:

* input records forwarded to the co-partitioned topic, and the input offsets they came from;
* join outputs and dead letters, and per co-partitioned partition the offset of the oldest frame with a
  record still held in a join buffer plus the processed position in that offset's metadata (see `progress`).

Input already partitioned by thing (`input_partitioned_by_thing`, as the stream connector writes it) skips
the hop: the input topic is the co-partitioned topic, each record its own frame.

Transactions are batched by time (`commit_interval_ms`) or size, never one per join. On assignment each
co-partitioned partition is re-read from its committed offset; frames below the processed position
rebuild the join state silently. On revocation the open transaction commits and the partitions' state is
dropped; whoever gets them rebuilds it the same way. KIP-447 fencing (consumer group metadata with the
offsets) keeps a zombie instance from committing after its partitions moved.
"""
from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from pipeline_core.kafka_clients import (admin_client, consumer_config, produce, retry_transient,
                                         transactional_producer_config)
from pipeline_core.partitioning import thing_partition
from pipeline_core.records import InvalidRecord, decode_record, dead_letter, encode_record, record_key
from pipeline_core.topics import MACHINE_DATA, TopicSpec, ensure_topics, partition_count

from local_stream_buffer.keyed import KeyedJoiner
from local_stream_buffer.specs import SpecResolver, load_join_specs
from local_stream_buffer.status import IngestStatus
from .progress import PartitionJoin, decode_metadata
from .repartition import FramedRecord, ThingRouter, decode_frame, frame_parts
from .settings import KafkaJoinerSettings
from .stats import JoinerStats, ProgressLog

log = logging.getLogger(__name__)

STAGE = "kafka_joiner"
_BATCH = 500  # messages per consume() call: bounds one call's work (frames hold up to as many records)
# How long consume() waits for a full batch. A live stream never fills one, so each round waits this out
# before it commits, and every hop's latency pays it (figures in the package README). Returning on the
# first message instead committed a transaction per handful of records, whose overhead made it worse.
_POLL_TIMEOUT_S = 0.005
_KAFKA_TIMEOUT_S = 30.0
_COMMIT_ATTEMPTS = 5
_SEEK_ATTEMPTS = 5
_NOTHING_DELIVERED = -1  # the append time an input partition counts with before its first record
_FIRST_RECORD_WAIT_S = 5.0  # how long after an assignment a partition yet to deliver holds the others back
_ACCEPTED = IngestStatus.ACCEPTED
_REJECTED = IngestStatus.REJECTED
_LATE = IngestStatus.LATE


class KafkaJoiner:
    """The standalone exactly-once joiner: machine.data -> keyed join -> machine.out (+ machine.dlq)."""

    def __init__(self, settings: KafkaJoinerSettings) -> None:
        self.settings = settings
        self.resolver = SpecResolver(load_join_specs(settings.join_specs))
        self.instance_id = settings.instance_id or uuid.uuid4().hex[:12]
        self.transactional_id = f"{settings.transactional_id_prefix}.{self.instance_id}"
        self._by_thing = settings.input_partitioned_by_thing
        # The topic whose partitions hold the joins: where every quantity of a thing lies in one partition.
        self.join_topic = settings.input_topic if self._by_thing else settings.repartition_topic_name()
        self.stats = JoinerStats()
        self._progress = ProgressLog(log, self.stats, settings.log_interval_s)
        self._stop_requested = False
        bootstrap = settings.kafka_bootstrap_servers
        self._producer = Producer(transactional_producer_config(bootstrap, self.transactional_id, **{
            "transaction.timeout.ms": settings.transaction_timeout_ms,
            "batch.size": 1_000_000,
            "compression.type": "none",
            "linger.ms": 20,
            "queue.buffering.max.messages": 1_000_000,
        }))
        consumer_overrides = {
            "session.timeout.ms": settings.session_timeout_ms,
            # Records of the co-partitioned topic become readable at each commit: fetch them without delay.
            "fetch.wait.max.ms": 10,
            # A fresh co-partitioned topic answers its first fetches with errors until its leader is known;
            # the default 500 ms back-off then delayed the first joins by as much.
            "fetch.error.backoff.ms": 20,
            # Small chunks per partition and fetch: partitions are consumed interleaved, so a key's two
            # streams (often in two partitions) stay close while a backlog is caught up, instead of one
            # running a whole partition ahead and forcing pending records out. (A larger record still
            # comes whole: Kafka returns at least one record per partition.)
            "max.partition.fetch.bytes": 256 * 1024,
        }
        if settings.instance_id:
            # Static membership: a restarted instance gets its partitions back without a rebalance.
            consumer_overrides["group.instance.id"] = settings.instance_id
        self._consumer = Consumer(consumer_config(bootstrap, settings.group_id, **consumer_overrides))
        self._router: ThingRouter | None = None
        self._input_partitions = 0
        self._owned: list[TopicPartition] = []
        self._forwarded: dict[int, int] = {}  # input partition -> next offset to forward
        self._input_times: dict[int, int] = {}  # input partition -> append time of its last consumed record
        self._paused: set[int] = set()  # input partitions held back by `_align_inputs`
        self._assignment_time = 0.0  # time.monotonic() of the last assignment
        self._assigned_at: dict[tuple[str, int], int] = {}  # where each owned partition started
        self._joins: dict[int, PartitionJoin] = {}  # co-partitioned partition -> its join
        self._assignment_changes = 0
        self._forced_reported = 0
        self._rewinds = 0  # aborted transactions that sent the consumer back to the last commit
        self._in_transaction = False
        self._transaction_started = 0.0
        self._transaction_records = 0
        self._transaction_append_times: list[int] = []  # per output: append time of its completing record

    # -- life cycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Create the co-partitioned topic (unless the input is one), fence earlier runs of this transactional
        id, join the group."""
        admin = admin_client(self.settings.kafka_bootstrap_servers)
        input_topic = self.settings.input_topic
        deadline_s = self.settings.kafka_startup_deadline_s
        self._input_partitions = partition_count(admin, input_topic, deadline_s)
        if self._by_thing:
            join_partitions = self._input_partitions
        else:
            ensure_topics(admin, (TopicSpec(self.join_topic, self._input_partitions, dict(MACHINE_DATA.config)),),
                          deadline_s=deadline_s)
            join_partitions = partition_count(admin, self.join_topic, deadline_s)  # an existing topic may differ
        self._router = ThingRouter(self.resolver, join_partitions)
        # Before joining the group: aborts the open transaction of a crashed run with this transactional id,
        # whose pending offsets would otherwise hold up reading the committed ones. A just started broker
        # answers it with NOT_COORDINATOR while it creates __transaction_state.
        retry_transient(lambda: self._producer.init_transactions(min(_KAFKA_TIMEOUT_S, deadline_s)),
                        what=f"initialising transactions ({self.transactional_id})", deadline_s=deadline_s)
        self._consumer.subscribe(sorted({input_topic, self.join_topic}),
                                 on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost)
        log.info("joining %s into %s (dlq %s) as %s in group %s, %s", input_topic, self.settings.output_topic,
                 self.settings.dlq_topic, self.transactional_id, self.settings.group_id,
                 "where each record lies (partitioned by thing)" if self._by_thing else f"via {self.join_topic}")

    def stop(self) -> None:
        """Ask the loop to finish: it commits what is done and returns (safe from a signal handler)."""
        self._stop_requested = True

    def run(self, until: Callable[[KafkaJoiner], bool] | None = None) -> None:
        """Consume, join and commit until `stop()` (or until `until(self)` holds), then commit and leave."""
        try:
            while not self._stop_requested:
                self.step()
                if until is not None and until(self):
                    break
        finally:
            self.close()

    def step(self) -> None:
        """One round: consume a batch, process it (committing whenever due), log when due."""
        changes = self._assignment_changes
        timeout = _POLL_TIMEOUT_S
        if self._in_transaction:
            # Wait no longer than the open transaction has until it is due: it commits on time.
            due_in = self._transaction_started + self.settings.commit_interval_ms / 1000 - time.monotonic()
            timeout = min(timeout, max(due_in, 0.0))
        messages = self._consumer.consume(_BATCH, timeout)
        if self._assignment_changes != changes:
            # A rebalance ran inside consume(): messages of this batch may predate it.
            self._reposition()
            messages = []
        if messages:
            self._process(messages)
        if (messages or self._paused) and not self._by_thing:
            # Also without input while partitions are paused: the partition they wait for may have turned
            # out empty, and only this resumes them.
            self._align_inputs()
        now = time.monotonic()
        # A short batch means the consumer waited for input: nothing is queued, so commit now instead of
        # at the interval. Each hop (input -> co-partitioned topic -> output) then costs one commit, not an
        # interval, while a backlog still commits by interval or size.
        if self._in_transaction and (len(messages) < _BATCH or self._commit_due(now)):
            self._commit()
        if self._progress.due(now):
            self._log_progress(now)

    def assigned(self) -> bool:
        """True once this instance owns partitions of both topics (after joining the group)."""
        return bool(self._joins) and bool(self._owned)

    def _commit_due(self, now: float) -> bool:
        return (now - self._transaction_started >= self.settings.commit_interval_ms / 1000
                or self._transaction_records >= self.settings.max_transaction_records)

    def close(self) -> None:
        """Commit what is done and leave the group."""
        try:
            if self._in_transaction:
                self._commit(rewind_on_abort=False)
        finally:
            self._consumer.close()
        self._producer.flush(_KAFKA_TIMEOUT_S)
        self._log_progress(time.monotonic())
        log.info("stopped")

    # -- processing ------------------------------------------------------------------------------------

    def _process(self, messages: list[Message]) -> None:
        input_topic = self.settings.input_topic
        stats = self.stats
        if stats.first_record_at is None:
            stats.first_record_at = time.monotonic()
        if self._by_thing:
            self._join_input(messages)
            return
        frames: dict[int, list[bytes]] = {}  # co-partitioned partition -> parts of its frame
        partition_of = self._router.partition
        forwarded = self._forwarded
        input_times = self._input_times
        rewinds = self._rewinds
        consumed = joinable = 0  # input records consumed (and forwarded) since they were last counted
        for message in messages:
            if not self._in_transaction:
                self._begin()
            if message.error() is not None:
                self._consumer_error(message.error())
                continue
            if message.topic() == input_topic:
                # Stage one: hand a joinable input record, unchanged, to the partition of its thing.
                key = message.key()
                source = message.partition()
                offset = message.offset()
                append_time = message.timestamp()[1]
                partition = partition_of(key)
                if partition is not None:
                    parts = frames.get(partition)
                    if parts is None:
                        parts = frames[partition] = []
                    frame_parts(parts, source, offset, append_time if append_time > 0 else 0, key, message.value())
                    joinable += 1
                forwarded[source] = offset + 1
                input_times[source] = append_time
                consumed += 1
                continue
            stats.records_in += consumed
            stats.joinable += joinable
            self._transaction_records += consumed
            consumed = joinable = 0
            self._join_frame(message)
            if self._commit_due(time.monotonic()):
                # Frames can be large: commit between them, so no transaction outlives its interval by much.
                self._flush_frames(frames)
                self._commit()
                if self._rewinds != rewinds:
                    return  # aborted: the rest of this batch is read again from the last commit
        stats.records_in += consumed
        stats.joinable += joinable
        self._transaction_records += consumed
        self._flush_frames(frames)

    def _flush_frames(self, frames: dict[int, list[bytes]]) -> None:
        for partition, parts in frames.items():
            produce(self._producer, self.join_topic, b"".join(parts), None, partition=partition)
        frames.clear()

    def _join_input(self, messages: list[Message]) -> None:
        """Input partitioned by thing: join every record in the partition it lies in, no forwarding hop."""
        joinable_of = self._router.partition
        batches: dict[int, list[tuple[int, int, int, bytes | None, bytes | None]]] = {}
        last_offsets: dict[int, int] = {}  # input partition -> offset of its last record in this batch
        consumed = joinable = 0
        for message in messages:
            if message.error() is not None:
                self._consumer_error(message.error())
                continue
            partition = message.partition()
            offset = last_offsets[partition] = message.offset()
            consumed += 1
            key = message.key()
            if joinable_of(key) is None:
                continue  # no join spec uses this quantity
            records = batches.get(partition)
            if records is None:
                records = batches[partition] = []
            append_time = message.timestamp()[1]
            records.append((partition, offset, append_time if append_time > 0 else 0, key, message.value()))
            joinable += 1
        if not consumed:
            return
        if not self._in_transaction:
            self._begin()
        self.stats.records_in += consumed
        self.stats.joinable += joinable
        self._transaction_records += consumed
        for partition, last_offset in last_offsets.items():
            join = self._joins.get(partition)
            if join is None:
                continue  # not ours (any more): whoever owns the partition reads it
            records = batches.get(partition)
            if records:
                self._join_records(join, records, frame_offset=None)
            join.advance(last_offset)

    def _join_frame(self, message: Message) -> None:
        """Stage two: ingest a frame of the co-partitioned topic into the partition's keyed join."""
        join = self._joins.get(message.partition())
        if join is None:
            return  # not ours (any more): whoever owns the partition reads it
        records = decode_frame(message.value() or b"")
        self._transaction_records += len(records)
        self._join_records(join, records, frame_offset=message.offset())
        join.advance(message.offset())

    def _join_records(self, join: PartitionJoin, records: list[tuple[int, int, int, bytes | None, bytes | None]],
                      frame_offset: int | None) -> None:
        """Ingest input records (`FramedRecord` fields) into a partition's keyed join, before `join.advance`.

        A record is held as the offset of its frame, or as its own input offset when the input is partitioned
        by thing (`frame_offset` None). Below the processed position records rebuild the state silently;
        outputs and dead letters come only from records processed for the first time.
        """
        replay_below = join.processed if join.processed is not None else -1
        ingest = join.joiner.ingest
        stats = self.stats
        produce_output = self._producer.produce
        output_topic = self.settings.output_topic
        append_times = self._transaction_append_times
        partitions = self._input_partitions
        rebuilt = joined = 0
        for framed in records:
            source = framed[1] if frame_offset is None else frame_offset
            replay = source < replay_below
            key = framed[3]
            try:
                record = decode_record(framed[4])
                expected_key = record_key(record["thing"], record["quantity"])
                if key != expected_key.encode():
                    raise InvalidRecord(f"key {key!r} does not match {expected_key!r}")
                if frame_offset is None and thing_partition(record["thing"], partitions) != framed[0]:
                    raise InvalidRecord(
                        f"misrouted: thing {record['thing']!r} belongs in partition "
                        f"{thing_partition(record['thing'], partitions)} of {partitions}, not {framed[0]}; the "
                        "input is not partitioned by thing (see pipeline_core.partitioning), so run the joiner without "
                        "--input-partitioned-by-thing")
            except InvalidRecord as error:
                if not replay:
                    self._dead_letter(str(error), FramedRecord._make(framed))
                continue
            # What is held is where a restart re-reads from: the frame, or the record itself.
            status, outputs, reason = ingest(record, source)
            if replay:
                rebuilt += 1
                continue
            joined += 1
            if status is not _ACCEPTED:
                if status is _REJECTED:
                    self._dead_letter(reason or "rejected", FramedRecord._make(framed))
                elif status is _LATE:
                    self._dead_letter("late: inside a gap of its stream that forcing already closed",
                                      FramedRecord._make(framed))
            for output in outputs:
                try:
                    payload = encode_record(output)
                except ValueError:
                    self._dead_letter("join result is not a finite number", FramedRecord._make(framed),
                                      output=json.dumps(output, default=repr))
                    continue
                try:
                    produce_output(output_topic, payload, record_key(output["thing"], output["quantity"]))
                except BufferError:  # local queue full: the shared helper waits for deliveries to drain it
                    produce(self._producer, output_topic, payload, record_key(output["thing"], output["quantity"]))
                append_times.append(framed[2])
        stats.rebuilt += rebuilt
        stats.joined_in += joined

    def _dead_letter(self, reason: str, framed: FramedRecord, **context: object) -> None:
        key = framed.key
        envelope = dead_letter(reason, framed.value, STAGE, topic=self.settings.input_topic,
                               partition=framed.partition, offset=framed.offset,
                               key=key.decode("utf-8", "replace") if key is not None else None, **context)
        produce(self._producer, self.settings.dlq_topic, envelope, key)
        self.stats.dead_letters += 1

    def _consumer_error(self, error: KafkaError) -> None:
        if error.fatal():
            raise KafkaException(error)
        log.warning("consumer: %s", error)

    # -- transactions ----------------------------------------------------------------------------------

    def _begin(self) -> None:
        self._producer.begin_transaction()
        self._in_transaction = True
        self._transaction_started = time.monotonic()
        self._transaction_records = 0

    def _offsets(self) -> list[TopicPartition]:
        offsets = [TopicPartition(self.settings.input_topic, partition, offset)
                   for partition, offset in self._forwarded.items()]
        for join in self._joins.values():
            position = join.commit_position()
            if position is not None:
                offsets.append(position)
        return offsets

    def _commit(self, rewind_on_abort: bool = True) -> None:
        """Commit outputs, dead letters, forwarded records and positions together; on failure go back."""
        try:
            offsets = self._offsets()
            if offsets:
                self._retry(lambda: self._producer.send_offsets_to_transaction(
                    offsets, self._consumer.consumer_group_metadata(), _KAFKA_TIMEOUT_S))
            self._retry(lambda: self._producer.commit_transaction(_KAFKA_TIMEOUT_S))
        except KafkaException as exception:
            error = exception.args[0]
            if not error.txn_requires_abort():
                raise
            log.warning("transaction aborted (%s): going back to the last commit", error)
            self._abort(rewind_on_abort)
            return
        self._in_transaction = False
        stats = self.stats
        stats.transactions += 1
        if self._transaction_append_times:
            committed_ms = time.time() * 1000
            stats.latencies_ms.extend(committed_ms - append for append in self._transaction_append_times)
            stats.joins_out += len(self._transaction_append_times)
            stats.last_commit_at = time.monotonic()
            self._transaction_append_times.clear()

    def _abort(self, rewind: bool) -> None:
        self._producer.abort_transaction(_KAFKA_TIMEOUT_S)
        self._in_transaction = False
        self._transaction_append_times.clear()
        self.stats.aborted += 1
        if rewind:
            self._rewinds += 1
            if self._paused:
                # The reloaded state starts unaligned: nothing may stay paused that no longer counts as such.
                self._consumer.resume([TopicPartition(self.settings.input_topic, p) for p in self._paused])
            # The aborted outputs are gone and the state has moved past them: restart every owned
            # partition from its last commit, exactly as after an assignment.
            self._load_state(self._owned)
            self._reposition()

    @staticmethod
    def _retry(call: Callable[[], None]) -> None:
        for attempt in range(_COMMIT_ATTEMPTS):
            try:
                call()
                return
            except KafkaException as exception:
                if not exception.args[0].retriable() or attempt == _COMMIT_ATTEMPTS - 1:
                    raise
                log.info("retrying after %s", exception.args[0])

    def _align_inputs(self) -> None:
        """Keep the input partitions within `align_ms` of append time of each other while they have a backlog.

        A thing's two joined quantities usually come from two partitions. Catching up a backlog partition
        by partition would run one stream far ahead of the other (partitions hold different numbers of
        keys), piling up pending records until the pending limit forces them, and forcing follows arrival,
        which a rebuild need not reproduce. Pausing the partitions ahead keeps both streams of a key close,
        like Kafka Streams picking the partition with the oldest record. Live input is never held back:
        its partitions advance together, and a partition at its end does not count.
        """
        topic = self.settings.input_topic
        behind: dict[int, int] = {}
        for partition, append_time in self._input_times.items():
            if partition in self._paused:
                behind[partition] = append_time
                continue
            try:
                _low, high = self._consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
            except KafkaException:
                continue
            if high > self._forwarded.get(partition, high):
                behind[partition] = append_time
        if time.monotonic() - self._assignment_time < _FIRST_RECORD_WAIT_S:
            # Right after an assignment, a partition's first fetch can come tens of thousands of records after
            # the others'. While it has not delivered and its lag is unknown or positive, the others wait for
            # it, as Kafka Streams waits for such a partition; for a while only, so that a partition without
            # a leader, or whose last offsets are a transaction's markers, stops nothing.
            for owned in self._owned:
                if owned.topic != topic or owned.partition in self._input_times:
                    continue
                try:
                    low, high = self._consumer.get_watermark_offsets(owned, cached=True)
                except KafkaException:
                    continue
                start = self._assigned_at.get((topic, owned.partition), OFFSET_BEGINNING)
                if high < 0 or high > (start if start >= 0 else low):
                    behind[owned.partition] = _NOTHING_DELIVERED
        floor = min((t for p, t in behind.items() if p not in self._paused), default=None)
        if floor is None:
            ahead: set[int] = set()
        else:
            ahead = {p for p, t in behind.items() if t > floor + self.settings.align_ms}
        if ahead - self._paused:
            self._consumer.pause([TopicPartition(topic, p) for p in ahead - self._paused])
        if self._paused - ahead:
            self._consumer.resume([TopicPartition(topic, p) for p in self._paused - ahead])
        self._paused = ahead

    # -- rebalancing -----------------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._assignment_changes += 1
        started = self._assignment_time = time.monotonic()
        positions = self._load_state(partitions)
        consumer.assign(positions)
        rebuilding = sum(join.rebuilding for join in self._joins.values())
        log.info("assigned %d partitions (%d co-partitioned, %d to rebuild) in %.2f s", len(partitions),
                 len(self._joins), rebuilding, time.monotonic() - started)

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._assignment_changes += 1
        if self._in_transaction:
            self._commit(rewind_on_abort=False)
        self._drop_state(partitions)
        log.info("revoked %d partitions", len(partitions))

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # The group has moved on: nothing of the open transaction may commit any more.
        self._assignment_changes += 1
        if self._in_transaction:
            self._abort(rewind=False)
        self._drop_state(partitions)
        log.warning("lost %d partitions", len(partitions))

    def _load_state(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """Fresh state for `partitions` from their committed offsets; returns where each starts."""
        self._drop_state(partitions)
        if not partitions:
            return []
        committed = self._consumer.committed(
            [TopicPartition(p.topic, p.partition) for p in partitions], timeout=_KAFKA_TIMEOUT_S)
        for position in committed:
            offset = position.offset if position.offset >= 0 else None
            self._assigned_at[(position.topic, position.partition)] = (
                offset if offset is not None else OFFSET_BEGINNING)
            if position.topic == self.join_topic:
                joiner = KeyedJoiner(self.resolver, max_pending_per_side=self.settings.max_pending_per_side)
                self._joins[position.partition] = PartitionJoin(
                    position.topic, position.partition, joiner, offset, decode_metadata(position.metadata))
        self._owned = [TopicPartition(p.topic, p.partition) for p in partitions]
        return committed

    def _drop_state(self, partitions: list[TopicPartition]) -> None:
        for position in partitions:
            self._assigned_at.pop((position.topic, position.partition), None)
            if position.topic == self.join_topic:
                self._joins.pop(position.partition, None)
            else:
                self._forwarded.pop(position.partition, None)
                self._input_times.pop(position.partition, None)
                self._paused.discard(position.partition)
        dropped = {(p.topic, p.partition) for p in partitions}
        self._owned = [p for p in self._owned if (p.topic, p.partition) not in dropped]

    def _reposition(self) -> None:
        """Move every owned partition back to the next offset its state expects."""
        for owned in self._owned:
            if owned.topic == self.join_topic:
                join = self._joins[owned.partition]
                offset = join.position if join.position is not None else self._assigned_at[
                    (owned.topic, owned.partition)]
            else:
                offset = self._forwarded.get(owned.partition, self._assigned_at[(owned.topic, owned.partition)])
            self._seek(TopicPartition(owned.topic, owned.partition, offset))

    def _seek(self, position: TopicPartition) -> None:
        # Right after an assignment the consumer starts each partition asynchronously, so a seek can come too
        # early: before the start (_STATE), or overtaken by it (_OUTDATED). Before, nothing of the partition
        # was delivered and it starts at the assigned offset, which is the position sought. Overtaken, the
        # seek goes after the start: seeking again then sets the position for certain.
        for attempt in range(_SEEK_ATTEMPTS):
            try:
                self._consumer.seek(position)
                return
            except KafkaException as exception:
                code = exception.args[0].code()
                if code == KafkaError._STATE:
                    return
                if code != KafkaError._OUTDATED or attempt == _SEEK_ATTEMPTS - 1:
                    raise
                log.debug("seeking %s [%d] again: %s", position.topic, position.partition, exception.args[0])

    # -- reporting -------------------------------------------------------------------------------------

    def _log_progress(self, now: float) -> None:
        held = sum(join.joiner.held_count() for join in self._joins.values())
        keys = sum(join.joiner.key_count() for join in self._joins.values())
        rebuilding = sum(join.rebuilding for join in self._joins.values())
        self._progress.log(now, self.lag(), held, keys, rebuilding)
        forced = self.forced()
        if forced > self._forced_reported:
            # Forcing follows arrival, which a rebuild after a crash need not reproduce: say so loudly.
            log.warning("%d pending records forced out by the pending limit (a stream of a key stalls); "
                        "their pairs are exact only if no restart happens before they are released", forced)
        self._forced_reported = forced

    def forced(self) -> int:
        """Pending records forced out by the pending limit in the owned partitions' joins."""
        return sum(join.joiner.counters.forced for join in self._joins.values())

    def lag(self) -> int:
        """Records not yet processed in the owned partitions, from the consumer's cached watermarks."""
        lag = 0
        for owned in self._owned:
            try:
                _low, high = self._consumer.get_watermark_offsets(owned, cached=True)
            except KafkaException:
                continue
            if owned.topic == self.join_topic:
                position = self._joins[owned.partition].position
            else:
                position = self._forwarded.get(owned.partition)
            if position is None:
                position = self._assigned_at.get((owned.topic, owned.partition), OFFSET_BEGINNING)
            if high >= 0 and position >= 0:
                lag += max(high - position, 0)
        return lag
