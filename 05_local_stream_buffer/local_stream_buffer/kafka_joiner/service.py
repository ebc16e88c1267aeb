"""The consume-join-produce loop: exactly once, join state included, through crashes and rebalances.

One consumer (subscribed to the input topic and the internal co-partitioned topic) and one transactional
producer per instance. Every transaction carries, atomically:

* input records forwarded to the co-partitioned topic, and the input offsets they came from;
* join outputs and dead letters, and per co-partitioned partition the offset of the oldest record still
  held in a join buffer plus the processed position in that offset's metadata (see `progress`).

Transactions are batched by time (`commit_interval_ms`) or size, never one per join. On assignment each
co-partitioned partition is re-read from its committed offset; records below the processed position
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

from stack.kafka_clients import admin_client, consumer_config, transactional_producer_config
from stack.records import InvalidRecord, decode_record, dead_letter, encode_record, record_key
from stack.topics import MACHINE_DATA, TopicSpec, ensure_topics

from ..keyed import KeyedJoiner
from ..specs import SpecResolver, load_join_specs
from ..status import IngestStatus
from .progress import PartitionJoin, decode_metadata
from .repartition import ThingRouter
from .settings import KafkaJoinerSettings
from .stats import JoinerStats, ProgressLog

log = logging.getLogger(__name__)

STAGE = "kafka_joiner"
_BATCH = 2_000  # messages per consume() call
_POLL_TIMEOUT_S = 0.02
_KAFKA_TIMEOUT_S = 30.0
_COMMIT_ATTEMPTS = 5
_REJECTED = IngestStatus.REJECTED
_LATE = IngestStatus.LATE


class KafkaJoiner:
    """The standalone exactly-once joiner: machine.data -> keyed join -> machine.out (+ machine.dlq)."""

    def __init__(self, settings: KafkaJoinerSettings) -> None:
        self.settings = settings
        self.resolver = SpecResolver(load_join_specs(settings.join_specs))
        self.instance_id = settings.instance_id or uuid.uuid4().hex[:12]
        self.transactional_id = f"{settings.transactional_id_prefix}.{self.instance_id}"
        self.repartition_topic = settings.repartition_topic_name()
        self.stats = JoinerStats()
        self._progress = ProgressLog(log, self.stats, settings.log_interval_s)
        self._stop_requested = False
        bootstrap = settings.kafka_bootstrap_servers
        self._producer = Producer(transactional_producer_config(bootstrap, self.transactional_id, **{
            "transaction.timeout.ms": settings.transaction_timeout_ms,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
        }))
        consumer_overrides = {
            "session.timeout.ms": settings.session_timeout_ms,
            # Records of the co-partitioned topic become readable at each commit: fetch them without delay.
            "fetch.wait.max.ms": 10,
        }
        if settings.instance_id:
            # Static membership: a restarted instance gets its partitions back without a rebalance.
            consumer_overrides["group.instance.id"] = settings.instance_id
        self._consumer = Consumer(consumer_config(bootstrap, settings.group_id, **consumer_overrides))
        self._router: ThingRouter | None = None
        self._owned: list[TopicPartition] = []
        self._forwarded: dict[int, int] = {}  # input partition -> next offset to forward
        self._assigned_at: dict[tuple[str, int], int] = {}  # where each owned partition started
        self._joins: dict[int, PartitionJoin] = {}  # co-partitioned partition -> its join
        self._assignment_changes = 0
        self._in_transaction = False
        self._transaction_started = 0.0
        self._transaction_records = 0
        self._transaction_append_times: list[int] = []  # per output: append time of its completing record

    # -- life cycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Create the co-partitioned topic, fence earlier runs of this transactional id, join the group."""
        admin = admin_client(self.settings.kafka_bootstrap_servers)
        input_partitions = self._partition_count(admin, self.settings.input_topic)
        ensure_topics(admin, (TopicSpec(self.repartition_topic, input_partitions, dict(MACHINE_DATA.config)),))
        self._router = ThingRouter(self.resolver, self._partition_count(admin, self.repartition_topic))
        # Before joining the group: aborts the open transaction of a crashed run with this transactional id,
        # whose pending offsets would otherwise hold up reading the committed ones.
        self._producer.init_transactions(_KAFKA_TIMEOUT_S)
        self._consumer.subscribe([self.settings.input_topic, self.repartition_topic],
                                 on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost)
        log.info("joining %s into %s (dlq %s) as %s in group %s, via %s", self.settings.input_topic,
                 self.settings.output_topic, self.settings.dlq_topic, self.transactional_id,
                 self.settings.group_id, self.repartition_topic)

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
        """One round: consume a batch, process it, commit when due, log when due."""
        changes = self._assignment_changes
        messages = self._consumer.consume(_BATCH, _POLL_TIMEOUT_S)
        if self._assignment_changes != changes:
            # A rebalance ran inside consume(): messages of this batch may predate it.
            self._reposition()
            messages = []
        if messages:
            if not self._in_transaction:
                self._begin()
            self._process(messages)
        now = time.monotonic()
        if self._in_transaction and (now - self._transaction_started >= self.settings.commit_interval_ms / 1000
                                     or self._transaction_records >= self.settings.max_transaction_records):
            self._commit()
        if self._progress.due(now):
            self._log_progress(now)

    def close(self) -> None:
        if self._in_transaction:
            self._commit(rewind_on_abort=False)
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
        for message in messages:
            if message.error() is not None:
                self._consumer_error(message.error())
                continue
            if message.topic() == input_topic:
                self._forward(message)
            else:
                self._join(message)
        self._transaction_records += len(messages)

    def _forward(self, message: Message) -> None:
        """Stage one: hand a joinable input record to the partition of its thing, unchanged."""
        partition = self._router.partition(message.key())
        self.stats.records_in += 1
        if partition is not None:
            source = f"{message.partition()}:{message.offset()}".encode()
            timestamp = message.timestamp()[1]
            self._produce(self.repartition_topic, message.value(), message.key(), partition=partition,
                          timestamp=max(timestamp, 0), headers=[("source", source)])
            self.stats.forwarded += 1
        self._forwarded[message.partition()] = message.offset() + 1

    def _join(self, message: Message) -> None:
        """Stage two: ingest into the partition's keyed join; emit outputs and dead letters once."""
        join = self._joins.get(message.partition())
        if join is None:
            return  # not ours (any more): whoever owns the partition reads it
        offset = message.offset()
        replay = join.is_replay(offset)
        value = message.value()
        try:
            record = decode_record(value)
            expected_key = record_key(record["thing"], record["quantity"])
            if message.key() != expected_key.encode():
                raise InvalidRecord(f"key {message.key()!r} does not match {expected_key!r}")
        except InvalidRecord as error:
            join.advance(offset)
            if not replay:
                self._dead_letter(str(error), message)
            return
        outcome = join.joiner.ingest(record, offset)
        join.advance(offset)
        if replay:
            self.stats.rebuilt += 1
            return
        self.stats.joined_in += 1
        status = outcome.status
        if status is _REJECTED:
            self._dead_letter(outcome.reason or "rejected", message)
        elif status is _LATE:
            self._dead_letter("late: inside a gap of its stream that forcing already closed", message)
        if outcome.outputs:
            output_topic = self.settings.output_topic
            append_time = message.timestamp()[1]
            for output in outcome.outputs:
                try:
                    payload = encode_record(output)
                except ValueError:
                    self._dead_letter("join result is not a finite number", message,
                                      output=json.dumps(output, default=repr))
                    continue
                self._produce(output_topic, payload, record_key(output["thing"], output["quantity"]))
                self._transaction_append_times.append(append_time)

    def _dead_letter(self, reason: str, message: Message, **context: object) -> None:
        source = dict(message.headers() or ()).get("source", b"")
        partition, _, offset = source.decode().partition(":")
        envelope = dead_letter(reason, message.value(), STAGE, topic=self.settings.input_topic,
                               partition=int(partition) if partition else None,
                               offset=int(offset) if offset else None,
                               key=message.key().decode("utf-8", "replace") if message.key() else None, **context)
        self._produce(self.settings.dlq_topic, envelope, message.key())
        self.stats.dead_letters += 1

    def _produce(self, topic: str, value: bytes, key: bytes | str | None, **options: object) -> None:
        while True:
            try:
                self._producer.produce(topic, value, key, **options)
                return
            except BufferError:  # local queue full: let deliveries drain
                self._producer.poll(0.05)

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

    # -- rebalancing -----------------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._assignment_changes += 1
        started = time.monotonic()
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
        committed = self._consumer.committed(
            [TopicPartition(p.topic, p.partition) for p in partitions], timeout=_KAFKA_TIMEOUT_S)
        for position in committed:
            offset = position.offset if position.offset >= 0 else None
            self._assigned_at[(position.topic, position.partition)] = (
                offset if offset is not None else OFFSET_BEGINNING)
            if position.topic == self.repartition_topic:
                joiner = KeyedJoiner(self.resolver, max_pending_per_side=self.settings.max_pending_per_side)
                self._joins[position.partition] = PartitionJoin(
                    position.topic, position.partition, joiner, offset, decode_metadata(position.metadata))
        self._owned = [TopicPartition(p.topic, p.partition) for p in partitions] if partitions else []
        return committed

    def _drop_state(self, partitions: list[TopicPartition]) -> None:
        for position in partitions:
            self._assigned_at.pop((position.topic, position.partition), None)
            if position.topic == self.repartition_topic:
                self._joins.pop(position.partition, None)
            else:
                self._forwarded.pop(position.partition, None)
        dropped = {(p.topic, p.partition) for p in partitions}
        self._owned = [p for p in self._owned if (p.topic, p.partition) not in dropped]

    def _reposition(self) -> None:
        """Move every owned partition back to the next offset its state expects."""
        for owned in self._owned:
            if owned.topic == self.repartition_topic:
                join = self._joins[owned.partition]
                offset = join.position if join.position is not None else self._assigned_at[
                    (owned.topic, owned.partition)]
            else:
                offset = self._forwarded.get(owned.partition, self._assigned_at[(owned.topic, owned.partition)])
            try:
                self._consumer.seek(TopicPartition(owned.topic, owned.partition, offset))
            except KafkaException as exception:
                # Not fetching yet: it will start at the assigned offset, nothing of it was delivered.
                if exception.args[0].code() != KafkaError._STATE:
                    raise

    # -- reporting -------------------------------------------------------------------------------------

    def _log_progress(self, now: float) -> None:
        held = sum(join.joiner.held_count() for join in self._joins.values())
        keys = sum(join.joiner.key_count() for join in self._joins.values())
        rebuilding = sum(join.rebuilding for join in self._joins.values())
        self._progress.log(now, self.lag(), held, keys, rebuilding)

    def lag(self) -> int:
        """Records not yet processed in the owned partitions, from the consumer's cached watermarks."""
        lag = 0
        for owned in self._owned:
            try:
                _low, high = self._consumer.get_watermark_offsets(owned, cached=True)
            except KafkaException:
                continue
            if owned.topic == self.repartition_topic:
                position = self._joins[owned.partition].position
            else:
                position = self._forwarded.get(owned.partition)
            if position is None:
                position = self._assigned_at.get((owned.topic, owned.partition), OFFSET_BEGINNING)
            if high >= 0 and position >= 0:
                lag += max(high - position, 0)
        return lag

    def state_size(self) -> int:
        """Records held in join buffers over all owned partitions."""
        return sum(join.joiner.held_count() for join in self._joins.values())

    @staticmethod
    def _partition_count(admin, topic: str) -> int:
        metadata = admin.list_topics(topic, timeout=_KAFKA_TIMEOUT_S).topics.get(topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            raise SystemExit(f"topic {topic} does not exist ({metadata.error if metadata else 'unknown'})")
        return len(metadata.partitions)

