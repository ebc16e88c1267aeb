"""The input grew (input partitioned by thing): the internal topics follow, and each join follows its thing.

Partitions beyond the changelog's count assigned to an instance mean machine.data grew: the changelog and the
handover topic get as many partitions before any new one is restored, and records are judged by the new count too.
A thing whose records the stream connector now places in another partition has its join state handed over there
through the handover topic (`handover`: request, hand over, adopt), each step inside the joiner's transaction.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import NewPartitions

from pipeline_core.kafka_clients import produce, retry_transient
from pipeline_core.records import InvalidRecord, decode_record
from pipeline_core.topics import partition_count

from .changelog import CLOCK_PREFIX, Restorer, adopted_key, adopted_position, decode_clock, decode_release
from .handover import Done, Handover, Pending, Request, moved_clock
from .partition_join import FrameJoiner
from .rebalance import OwnedPartitions
from .transaction import KAFKA_TIMEOUT_S, Transaction

log = logging.getLogger(__name__)


def grow_internal(admin, topics: Iterable[str], join_topic: str, count: int, deadline_s: float) -> int:
    """Give each of `topics` (the changelog, the handover topic) `count` partitions (each grown, if it has fewer),
    and wait until Kafka says so; returns `count`."""
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
        retry_transient(lambda topic=topic: at_least(partition_count(admin, topic, deadline_s), count, topic),
                        what=f"waiting for {topic} to show {count} partitions", deadline_s=deadline_s)
        log.info("%s grew from %d to %d partitions, as %s did", topic, have, count, join_topic)
    return count


class GrowthFollower:
    """What the joiner does for a grown input: called from its rebalance callbacks and its loop (`step`), and
    committing through `commit` (the joiner's, which commits every position with the transaction)."""

    def __init__(self, handover: Handover, *, admin, consumer: Consumer, transaction: Transaction,
                 commit: Callable[[], bool], partitions: OwnedPartitions, frames: FrameJoiner, restorer: Restorer,
                 join_topic: str, state_topic: str, join_partitions: int, deadline_s: float) -> None:
        self.handover = handover
        self._admin = admin
        self._consumer = consumer
        self._transaction = transaction
        self._commit = commit
        self._partitions = partitions
        self._frames = frames
        self._restorer = restorer
        self.join_topic = join_topic
        self.state_topic = state_topic
        self._deadline_s = deadline_s
        # The partition counts the input is known to have had, and its internal topics' count.
        self._counts = [join_partitions]
        self._internal_partitions = join_partitions

    # -- the group's changes -----------------------------------------------------------------------------

    def assign(self, partitions: list[TopicPartition]) -> None:
        """Before the owned partitions take `partitions`: the internal topics follow a grown input."""
        highest = max((p.partition for p in partitions if p.topic == self.join_topic), default=-1)
        if highest < self._internal_partitions:
            return
        count = partition_count(self._admin, self.join_topic, self._deadline_s)
        self._internal_partitions = grow_internal(self._admin, (self.state_topic, self.handover.topic),
                                                  self.join_topic, count, self._deadline_s)
        self._producer_knows(count)  # the state of the new partitions goes to their changelog partitions
        if count not in self._counts:
            self._counts.append(count)
            self._frames.counts = tuple(self._counts)

    def assigned(self, partitions: list[TopicPartition]) -> None:
        """After the owned partitions took `partitions`: their handover partitions from their committed positions."""
        self.handover.assign(self._committed([p.partition for p in partitions]))

    def revoke(self, partitions: list[TopicPartition]) -> None:
        self.handover.revoke(p.partition for p in partitions if p.topic == self.join_topic)

    def reset(self) -> None:
        """The transaction aborted: what it handed over or asked for went with it."""
        self.handover.reset(self._committed(list(self.handover.partitions)))

    def positions(self) -> list[TopicPartition]:
        return self.handover.positions()

    def close(self) -> None:
        self.handover.close()

    def _committed(self, partitions: list[int]) -> list[TopicPartition]:
        if not partitions:
            return []
        return self._consumer.committed([TopicPartition(self.handover.topic, partition) for partition in partitions],
                                        timeout=KAFKA_TIMEOUT_S)

    # -- the loop's turn ---------------------------------------------------------------------------------

    def step(self) -> None:
        """Read the handover topic; ask for the things stopped partitions wait for; hand over what is due;
        go on with partitions whose things came (`handover`)."""
        handover = self.handover
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
        produced(produce(self._transaction.producer, self.handover.topic, request.encode(),
                         thing.encode(), partition=home))
        awaited.requested = True
        self.handover.requests_sent += 1
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
                produced(produce(producer, self.state_topic, record.value,
                                 adopted_key(request.at, index, join.feeds(record)), partition=request.to))
            for record in keyed_records:
                value = record.value
                if record.key.startswith(CLOCK_PREFIX):
                    value = moved_clock(record.key, value, places)
                produced(produce(producer, self.state_topic, value, record.key, partition=request.to))
            for record in (*records, *keyed_records):
                produced(produce(producer, self.state_topic, None, record.key, partition=partition))
            produced(produce(producer, self.handover.topic,
                             Done(request.thing, partition, bool(records or keyed_records)).encode(),
                             request.thing.encode(), partition=request.to))
            self.handover.partitions[partition].pending.remove(pending)
            moving[request.thing], moving_keyed[request.thing] = [], []  # a thing asked for twice goes once
            if records or keyed_records:
                self.handover.handed_over += 1
                log.info("%s [%d]: handed the join state of %s (%d records) over to partition %d", self.join_topic,
                         partition, request.thing, len(records) + len(keyed_records), request.to)
        join.replace_state(kept, self.state_topic, kept_keyed)
        self._commit()

    def _producer_knows(self, partitions: int) -> None:
        """Wait until the producer's metadata holds `partitions` partitions of the changelog and the handover topic:
        another instance may have grown them, and a producer learns of new partitions only at its next refresh."""
        producer = self._transaction.producer
        for topic in (self.state_topic, self.handover.topic):
            retry_transient(lambda topic=topic: at_least(
                len(producer.list_topics(topic, timeout=KAFKA_TIMEOUT_S).topics[topic].partitions), partitions, topic),
                what=f"learning of {partitions} partitions of {topic}", deadline_s=self._deadline_s)

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


def at_least(have: int, count: int, topic: str) -> int:
    if have < count:
        raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION, f"{topic} shows {have} partitions yet"))
    return have


def produced(refused: KafkaError | None) -> None:
    """Frames (bounded by `repartition.FRAME_MAX_BYTES`) and state records (input records) are never larger
    than the producer takes; should it refuse one, the transaction must not commit without it."""
    if refused is not None:
        raise KafkaException(refused)


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
