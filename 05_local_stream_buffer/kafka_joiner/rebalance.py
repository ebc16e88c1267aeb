"""The partitions an instance owns, and their join state across rebalances.

On assignment each partition of the co-partitioned topic gets a fresh join, read from its committed
offset: frames below the processed position rebuild the state silently (see `partition_join`). Input
partitions (input partitioned by key) resume after their last forwarded record. On revocation the
caller commits first, then the partitions' state is dropped; whoever gets them rebuilds it the same way.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from local_stream_buffer.keyed import KeyedJoiner
from .alignment import InputAlignment
from .partition_join import PartitionJoin, decode_metadata
from .progress import StateFigures
from .repartition import Forwarder
from .transaction import KAFKA_TIMEOUT_S

log = logging.getLogger(__name__)

_SEEK_ATTEMPTS = 5


class OwnedPartitions:
    """What this instance owns: every assigned partition with the offset it started from, and the join of
    each co-partitioned partition.

    :param new_joiner: an empty keyed join for a co-partitioned partition.
    :param forwarder, alignment: stage one's state per input partition (input partitioned by key), or None.
    """

    def __init__(self, consumer: Consumer, join_topic: str, new_joiner: Callable[[], KeyedJoiner],
                 forwarder: Forwarder | None = None, alignment: InputAlignment | None = None) -> None:
        self._consumer = consumer
        self._join_topic = join_topic
        self._new_joiner = new_joiner
        self._forwarder = forwarder
        self._alignment = alignment
        self.owned: list[TopicPartition] = []
        self.started_at: dict[tuple[str, int], int] = {}  # where each owned partition started
        self.joins: dict[int, PartitionJoin] = {}  # co-partitioned partition -> its join
        self.changes = 0  # assignments and revocations so far

    def assign(self, partitions: list[TopicPartition]) -> None:
        """The group gave us `partitions`: fresh state from their commits, and the consumer reads on from there."""
        self.changes += 1
        started = time.monotonic()
        if self._alignment is not None:
            self._alignment.assigned()
        self._consumer.assign(self.load(partitions))
        rebuilding = sum(join.rebuilding for join in self.joins.values())
        log.info("assigned %d partitions (%d co-partitioned, %d to rebuild) in %.2f s", len(partitions),
                 len(self.joins), rebuilding, time.monotonic() - started)

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
        for position in committed:
            offset = position.offset if position.offset >= 0 else None
            self.started_at[(position.topic, position.partition)] = offset if offset is not None else OFFSET_BEGINNING
            if position.topic == self._join_topic:
                self.joins[position.partition] = PartitionJoin(
                    position.topic, position.partition, self._new_joiner(), offset, decode_metadata(position.metadata))
        self.owned = [TopicPartition(p.topic, p.partition) for p in partitions]
        return committed

    def drop(self, partitions: list[TopicPartition]) -> None:
        for position in partitions:
            self.started_at.pop((position.topic, position.partition), None)
            if position.topic == self._join_topic:
                self.joins.pop(position.partition, None)
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
        self.load(list(self.owned))
        self.reposition()

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
                return
            except KafkaException as exception:
                code = exception.args[0].code()
                if code == KafkaError._STATE:
                    return
                if code != KafkaError._OUTDATED or attempt == _SEEK_ATTEMPTS - 1:
                    raise
                log.debug("seeking %s [%d] again: %s", position.topic, position.partition, exception.args[0])

    def lag(self) -> int:
        """Records not yet processed in the owned partitions, from the consumer's cached watermarks."""
        lag = 0
        for owned, start in self.starts():
            try:
                _low, high = self._consumer.get_watermark_offsets(owned, cached=True)
            except KafkaException:
                continue
            position = self.position(owned)
            if position is None:
                position = start
            if high >= 0 and position >= 0:
                lag += max(high - position, 0)
        return lag

    def forced(self) -> int:
        """Pending records forced out by the pending limit in the owned partitions' joins."""
        return sum(join.joiner.counters.forced for join in self.joins.values())

    def figures(self) -> StateFigures:
        joins = self.joins.values()
        return StateFigures(lag=self.lag(), held=sum(join.joiner.held_count() for join in joins),
                            keys=sum(join.joiner.key_count() for join in joins),
                            rebuilding=sum(join.rebuilding for join in joins), forced=self.forced())
