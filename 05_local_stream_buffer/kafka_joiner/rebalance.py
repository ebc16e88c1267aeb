"""The partitions an instance owns, and their join state across rebalances.

On assignment each partition of the co-partitioned topic gets its join restored from the changelog (see
`changelog`) and is read on from its committed offset, the processed position. Input partitions (input
partitioned by key) resume after their last forwarded record. On revocation the caller commits first,
then the partitions' state is dropped; whoever gets them restores it the same way.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from pipeline_core.broker_offsets import BrokerOffsets
from pipeline_core.consumer_lag import partition_lag
from pipeline_core.data_loss import OffsetWatch

from local_stream_buffer.clock import ClockCounters
from local_stream_buffer.keyed import KeyedJoiner
from local_stream_buffer.specs import JoinSpec
from .alignment import InputAlignment
from .changelog import Restorer, StateRecord
from .partition_join import PartitionJoin
from .progress import JoinerStats, StateFigures
from .repartition import Forwarder
from .transaction import KAFKA_TIMEOUT_S

log = logging.getLogger(__name__)

_SEEK_ATTEMPTS = 5


class OwnedPartitions:
    """What this instance owns: every assigned partition with the offset it started from, and the join of
    each co-partitioned partition.

    :param new_joiner: an empty keyed join for a co-partitioned partition, given its release, evict and drop hooks.
    :param restorer: reads the held records of co-partitioned partitions from the changelog.
    :param forwarder, alignment: stage one's state per input partition (input partitioned by key), or None.
    :param broker_offsets: the ends of owned partitions nothing was delivered of (`lag`).
    """

    def __init__(self, consumer: Consumer, join_topic: str, new_joiner: Callable[..., KeyedJoiner],
                 restorer: Restorer, stats: JoinerStats, forwarder: Forwarder | None = None,
                 alignment: InputAlignment | None = None, watch: OffsetWatch | None = None, *,
                 broker_offsets: BrokerOffsets, specs: Mapping[str, JoinSpec] | None = None) -> None:
        self._consumer = consumer
        self._broker_offsets = broker_offsets
        self._specs = dict(specs or {})  # the join specs run, by fingerprint: where each started is in the commits
        self._watch = watch
        self._join_topic = join_topic
        self._new_joiner = new_joiner
        self._restorer = restorer
        self._stats = stats
        self._forwarder = forwarder
        self._alignment = alignment
        self.owned: list[TopicPartition] = []
        self.started_at: dict[tuple[str, int], int] = {}  # where each owned partition started
        self.joins: dict[int, PartitionJoin] = {}  # co-partitioned partition -> its join
        # Per machine, what the clock rule did in joins this process no longer has (revoked, or reloaded).
        self._clock_faults_before: dict[str, ClockCounters] = {}
        self.changes = 0  # assignments and revocations so far
        self.stopped: set[int] = set()  # co-partitioned partitions paused while their joins wait (`handover`)

    def assign(self, partitions: list[TopicPartition]) -> None:
        """The group gave us `partitions`: fresh state from their commits, and the consumer reads on from there."""
        self.changes += 1
        started = time.monotonic()
        restored, read = self._stats.rebuilt, self._stats.state_records_read
        self._consumer.assign(self.load(partitions))
        # librdkafka keeps a partition's pause through its revocation: one stopped for a handover before is read again.
        joined = [TopicPartition(p.topic, p.partition) for p in partitions if p.topic == self._join_topic]
        if joined:
            self._consumer.resume(joined)
        if self._alignment is not None:
            self._alignment.assigned(partitions)
        log.info("assigned %d partitions (%d co-partitioned): restored %d held records from %d changelog records, "
                 "%d partitions to replay, in %.2f s", len(partitions), len(self.joins),
                 self._stats.rebuilt - restored, self._stats.state_records_read - read,
                 sum(join.replaying for join in self.joins.values()), time.monotonic() - started)

    def revoke(self, partitions: list[TopicPartition], lost: bool = False) -> None:
        """`partitions` moved to another instance (after the caller committed, or aborted if `lost`)."""
        self.changes += 1
        self.drop(partitions)
        if lost:
            log.warning("lost %d partitions", len(partitions))
        else:
            log.info("revoked %d partitions", len(partitions))

    def load(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """Fresh state for `partitions` from their committed offsets; returns where each starts."""
        self.drop(partitions)
        if not partitions:
            return []
        committed = self._consumer.committed(
            [TopicPartition(p.topic, p.partition) for p in partitions], timeout=KAFKA_TIMEOUT_S)
        if self._watch is not None:
            self._watch.assigned(committed)
        for position in committed:
            offset = position.offset if position.offset >= 0 else None
            self.started_at[(position.topic, position.partition)] = offset if offset is not None else OFFSET_BEGINNING
            if position.topic == self._join_topic:
                self._let_go(position.partition)
                self.joins[position.partition] = PartitionJoin(
                    position.topic, position.partition, self._new_joiner, offset, position.metadata, self._specs)
        # After the commits: reading them waits for a transaction still open on them, which also settles
        # the changelog records written with them.
        held, read = self._restorer.restore([p.partition for p in partitions if p.topic == self._join_topic])
        for partition, records in held.items():
            join = self.joins[partition]
            if join.state_lost(self._restorer.covered.get(partition), records):
                self._rebuild(join, records, self._restorer.covered.get(partition),
                              self._restorer.releases.get(partition, []))
                committed = [TopicPartition(p.topic, p.partition, OFFSET_BEGINNING)
                             if (p.topic, p.partition) == (join.topic, partition) else p for p in committed]
                self.started_at[(join.topic, partition)] = OFFSET_BEGINNING
                if self._watch is not None:  # read from the start on purpose: no offset went back
                    self._watch.sought(TopicPartition(join.topic, partition, OFFSET_BEGINNING))
                continue
            self._stats.rebuilt += join.restore(records, self._restorer.topic, self._restorer.releases.get(partition, []))
        self._stats.state_records_read += read
        self.owned = [TopicPartition(p.topic, p.partition) for p in partitions]
        return committed

    def _rebuild(self, join: PartitionJoin, held: list[StateRecord], covered: int | None,
                 releases: list[StateRecord]) -> None:
        """The changelog lost `join`'s state: rebuild it from the partition's beginning. Records retention
        deleted from before the committed offset are missing from it: counted, and said."""
        join.rebuild(held, releases)
        low, _high = self._consumer.get_watermark_offsets(TopicPartition(join.topic, join.partition),
                                                          timeout=KAFKA_TIMEOUT_S)
        lost = max(0, min(low, join.committed))
        log.warning("%s [%d]: the state topic covers %s of the committed offset %d (deleted or recreated?): "
                    "rebuilding the join state from the partition's beginning, outputs committed before suppressed",
                    join.topic, join.partition, "none" if covered is None else f"up to {covered}", join.committed)
        if lost:
            self._stats.rebuild_records_lost += lost
            log.warning("%s [%d]: the rebuild misses the first %d records (deleted by retention): pairs of the rebuilt "
                        "state around them may differ from the committed output", join.topic, join.partition, lost)

    def drop(self, partitions: list[TopicPartition]) -> None:
        for position in partitions:
            self.started_at.pop((position.topic, position.partition), None)
            if position.topic == self._join_topic:
                self._let_go(position.partition)
                self.stopped.discard(position.partition)
            else:
                if self._forwarder is not None:
                    self._forwarder.drop(position.partition)
                if self._alignment is not None:
                    self._alignment.drop(position.partition)
        dropped = {(p.topic, p.partition) for p in partitions}
        self.owned = [p for p in self.owned if (p.topic, p.partition) not in dropped]

    def reload(self) -> None:
        """Back to the last commit (after an aborted transaction): every owned partition restarts from its
        committed offset, exactly as after an assignment."""
        if self._alignment is not None:
            self._alignment.resume_all()
        if self.stopped:  # paused for a handover: read again from the commit as well
            self._consumer.resume([TopicPartition(self._join_topic, partition) for partition in self.stopped])
            self.stopped.clear()
        self.load(list(self.owned))
        self.reposition()

    def stop(self, partition: int) -> None:
        """Pause a co-partitioned partition whose join waits for a thing's state (`handover`)."""
        if partition not in self.stopped:
            self.stopped.add(partition)
            self._consumer.pause([TopicPartition(self._join_topic, partition)])

    def go_on(self, partition: int) -> None:
        """Read a stopped partition on from its join's position."""
        owned = TopicPartition(self._join_topic, partition)
        if partition in self.stopped:
            self.stopped.discard(partition)
            self._consumer.resume([owned])
        offset = self.position(owned)
        self._seek(TopicPartition(self._join_topic, partition,
                                  offset if offset is not None else self.started_at[(self._join_topic, partition)]))

    def reposition(self) -> None:
        """Move every owned partition back to the next offset its state expects."""
        for owned in self.owned:
            offset = self.position(owned)
            self._seek(TopicPartition(owned.topic, owned.partition,
                                      offset if offset is not None else self.started_at[(owned.topic, owned.partition)]))

    def position(self, owned: TopicPartition) -> int | None:
        """The next offset to process in an owned partition, once anything of it was processed."""
        if owned.topic == self._join_topic:
            return self.joins[owned.partition].position
        return self._forwarder.positions.get(owned.partition) if self._forwarder is not None else None

    def starts(self) -> list[tuple[TopicPartition, int]]:
        """Every owned partition with the offset it started from (OFFSET_BEGINNING: the beginning)."""
        return [(owned, self.started_at.get((owned.topic, owned.partition), OFFSET_BEGINNING))
                for owned in self.owned]

    def _seek(self, position: TopicPartition) -> None:
        # Right after an assignment the consumer starts each partition asynchronously, so a seek can come too
        # early: before the start (_STATE), or overtaken by it (_OUTDATED). Before, nothing of the partition
        # was delivered and it starts at the assigned offset, which is the position sought. Overtaken, the
        # seek goes after the start: seeking again then sets the position for certain.
        for attempt in range(_SEEK_ATTEMPTS):
            try:
                self._consumer.seek(position)
                if self._watch is not None:
                    self._watch.sought(position)
                return
            except KafkaException as exception:
                code = exception.args[0].code()
                if code == KafkaError._STATE:
                    return
                if code != KafkaError._OUTDATED or attempt == _SEEK_ATTEMPTS - 1:
                    raise
                log.debug("seeking %s [%d] again: %s", position.topic, position.partition, exception.args[0])

    def lag(self) -> int:
        """Records not yet processed in the owned partitions (`pipeline_core.consumer_lag.partition_lag`). The
        ends of those the consumer does not fetch, whose cached ends stopped moving, are the broker's: nothing
        delivered since their assignment, or paused (ahead in the input's alignment, stopped for a handover)."""
        # The consumer's position is past what it was handed, and past the transaction markers and aborted records it
        # skipped, which no join ever processes (the stream connector's start-up fence, say): where a partition's
        # join is not stopped for a handover, those do not wait for it.
        fetched = {(p.topic, p.partition): p.offset for p in self._consumer.position(self.owned) if p.offset >= 0}
        not_fetched = {(self._join_topic, partition) for partition in self.stopped}
        if self._alignment is not None:
            not_fetched |= self._alignment.paused_partitions()
        positions = []
        for owned, start in self.starts():
            key = (owned.topic, owned.partition)
            if key not in fetched:
                not_fetched.add(key)
                position = start
            else:
                processed = self.position(owned)
                position = start if processed is None else processed
                if owned.topic != self._join_topic or owned.partition not in self.stopped:
                    position = max(position, fetched[key])
            positions.append(TopicPartition(owned.topic, owned.partition, position))
        return partition_lag(self._consumer, positions, self._broker_offsets, not_fetched) or 0

    def forced(self) -> int:
        """Pending records forced out by the pending limit in the owned partitions' joins."""
        return sum(join.joiner.counters.forced for join in self.joins.values())

    def flush_state(self, produce_state: Callable[[int, bytes, bytes | None], None],
                    produce_dead_letter: Callable[[bytes], None]) -> None:
        """Hand what changed in every join's held records since the last commit, and the offset they cover, to
        `produce_state(partition, key, value)` (value None: a tombstone), and the dead letters of changelog
        records dropped on restore to `produce_dead_letter`."""
        for join in self.joins.values():
            join.flush_state(produce_state, produce_dead_letter)

    def _let_go(self, partition: int) -> None:
        """Forget a partition's join, keeping what its clock rule counted."""
        join = self.joins.pop(partition, None)
        if join is not None:
            for thing, faults in join.joiner.clock_faults().items():
                self._clock_faults_before.setdefault(thing, ClockCounters()).add(faults)

    def clock_faults(self) -> dict[str, ClockCounters]:
        """Per machine, what the clock rule did to its streams in this process (`local_stream_buffer.clock`)."""
        totals = {thing: ClockCounters(*faults.as_tuple()) for thing, faults in self._clock_faults_before.items()}
        for join in self.joins.values():
            for thing, faults in join.joiner.clock_faults().items():
                totals.setdefault(thing, ClockCounters()).add(faults)
        return totals

    def figures(self) -> StateFigures:
        joins = self.joins.values()
        return StateFigures(lag=self.lag(), held=sum(join.joiner.held_count() for join in joins),
                            keys=sum(join.joiner.key_count() for join in joins),
                            replaying=sum(join.replaying for join in joins), forced=self.forced(),
                            clock_faults=self.clock_faults())
