"""Loss outside the pipeline's control, made loud: records a broker deleted before a stage read them, a topic
deleted under a running stage, and a consumer reset to the earliest offset.

A consumer set to `auto.offset.reset=earliest` moves on by itself in all three cases, without a word. The
stages keep that (it keeps them running) and watch their consumer with an `OffsetWatch` instead: it knows
the next offset each partition should deliver (its committed offset at assignment, a sought offset, or
the record after the last one read) and compares the offset of each record it delivers with it.

* A record beyond the expected offset is a gap. Transaction markers, aborted and compacted records leave
  gaps too; the records of a gap below the partition's log start (its low watermark) are the ones retention
  (or a `delete_records`) deleted unread: those are counted (`records_skipped`), and the reset.
* A record before the expected offset means the partition's offsets went back: the topic was deleted and
  created again before the consumer noticed (or truncated), and the consumer reset to the earliest offset.
* A partition assigned without a committed offset where the group had one (this process saw it, or the group
  has offsets of the topic's other partitions) is a reset too; what lies below its low watermark was never
  read.
* A subscribed topic the broker no longer knows (`UNKNOWN_TOPIC_OR_PART`) was deleted: counted once,
  and its partitions read from their start when it comes back (Kafka drops a deleted topic's committed
  offsets, so the consumer does that by itself).

Each is counted in the stage's `ConsumerCounters` (reported to `pipeline_health`) and logged as a warning.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from .progress import ConsumerCounters

log = logging.getLogger(__name__)

# How long to ask the broker for a partition's watermarks when the consumer has none cached.
WATERMARK_TIMEOUT_S = 5.0
# The consumer errors that say a subscribed topic is gone.
_TOPIC_GONE = frozenset((KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC))

Partition = tuple[str, int]


def deleted_unread(expected: int, offset: int, log_start: int) -> int:
    """Of the offsets from `expected` up to the record read at `offset`, how many the broker deleted before
    they were read: those below the partition's log start. The rest of a gap are transaction markers,
    aborted or compacted records, which are not data lost."""
    return max(0, min(offset, log_start) - expected)


class OffsetWatch:
    """Notices what a consumer skipped without being asked; see the module docstring.

    :param consumer: the stage's consumer, asked for watermarks only when a gap, a reset or a deletion needs
        them (cached first), never per record.
    :param counters: where the stage counts what is noticed.
    """

    def __init__(self, consumer: Consumer, counters: ConsumerCounters, logger: logging.Logger | None = None) -> None:
        self._consumer = consumer
        self._counters = counters
        self._log = logger or log
        self._next: dict[Partition, int] = {}  # the next offset expected per partition
        self._had_commit: set[Partition] = set()  # partitions assigned with a committed offset
        self._topics: set[str] = set()  # topics assigned to this consumer
        self._deleted_topics: set[str] = set()  # deleted under us, not assigned again since
        self._went_back: dict[str, set[int]] = {}  # per topic, its partitions seen going back since its last recreation

    def assigned(self, committed: Sequence[TopicPartition]) -> None:
        """Partitions assigned, each with its committed offset (negative: none), where the consumer resumes."""
        with_commits = {position.topic for position in committed if position.offset >= 0}
        for position in committed:
            key = (position.topic, position.partition)
            if position.offset >= 0:
                self._next[key] = position.offset
                self._had_commit.add(key)
                continue
            self._next.pop(key, None)
            if position.topic in self._deleted_topics:
                self._log.info("%s [%d] is back after its topic was deleted: reading it from its start", *key)
            elif key in self._had_commit or position.topic in with_commits:
                self._reset_without_commit(position, key in self._had_commit)
        self._topics.update(position.topic for position in committed)
        self._deleted_topics.difference_update(self._topics)

    def _reset_without_commit(self, position: TopicPartition, had_one: bool) -> None:
        """A partition the group had read (or of a topic it reads) without a committed offset."""
        low = self._log_start(position) or 0
        if not had_one and low == 0:
            # Most likely a partition added to the topic: the earliest offset is its first record.
            self._log.info("%s [%d] has no committed offset: reading it from its start", position.topic,
                           position.partition)
            return
        self._counters.offset_resets += 1
        self._counters.records_skipped += low
        self._log.warning(
            "%s [%d] has no committed offset %s: the consumer resets to the earliest offset, %d%s",
            position.topic, position.partition,
            "any more (it had one before)" if had_one else "where the group has offsets of its topic", low,
            f"; the {low:,} records below it were deleted unread" if low else "")

    def sought(self, position: TopicPartition) -> None:
        """The consumer was moved to `position` (negative offset: a logical one, the next record is taken as is)."""
        key = (position.topic, position.partition)
        if position.offset >= 0:
            self._next[key] = position.offset
        else:
            self._next.pop(key, None)

    def consumed(self, records: Sequence[Message]) -> None:
        """A batch of records (no error events) as the consumer delivered them, before they are processed. (The
        hot path: one look-up per record.)"""
        expected = self._next
        expected_at = expected.get
        for record in records:
            key = (record.topic(), record.partition())
            offset = record.offset()
            if expected_at(key, offset) != offset:
                self._jumped(key, expected[key], offset)
            expected[key] = offset + 1

    def consumer_error(self, error: KafkaError, topic: str | None) -> bool:
        """A consumer error event: True when it says a subscribed topic is gone (then counted and logged);
        False for any other error, which the caller handles."""
        if error.code() not in _TOPIC_GONE:
            return False
        if topic is None or topic in self._deleted_topics:
            return True
        if topic not in self._topics:
            self._log.info("subscribed topic %s does not exist (yet): %s", topic, error.str())
            return True
        self._topics.discard(topic)
        self._deleted_topics.add(topic)
        for key in [key for key in self._next if key[0] == topic]:
            del self._next[key]
        self._had_commit.difference_update([key for key in self._had_commit if key[0] == topic])
        self._went_back.pop(topic, None)
        self._counters.topics_deleted += 1
        self._log.warning("topic %s was deleted under this stage (%s): what was not read of it is gone; reading it "
                          "from its start if it is created again", topic, error.str())
        return True

    def _jumped(self, key: Partition, expected: int, offset: int) -> None:
        if offset < expected:
            # The broker did not say the topic was gone (it came back before the consumer asked): a partition going
            # back says it. One recreation is counted once, however many of its partitions show it.
            went_back = self._went_back.setdefault(key[0], set())
            if not went_back or key[1] in went_back:
                went_back.clear()
                self._counters.topics_deleted += 1
            went_back.add(key[1])
            self._counters.offset_resets += 1
            self._log.warning("%s [%d] went back from offset %d to %d: the topic was deleted and created again (or "
                              "truncated), and the consumer reset to its earliest offset; what was not read of it is "
                              "gone", *key, expected, offset)
            return
        low = self._log_start(TopicPartition(*key))
        if low is None:
            return
        skipped = deleted_unread(expected, offset, low)
        if skipped:
            self._counters.offset_resets += 1
            self._counters.records_skipped += skipped
            self._log.warning("%s [%d]: %d records (offsets %d to %d) were deleted by retention before this stage "
                              "read them; the consumer reset to offset %d", *key, skipped, expected,
                              expected + skipped - 1, offset)

    def _log_start(self, position: TopicPartition) -> int | None:
        """The partition's low watermark: as the consumer's last fetch saw it, else asked of the broker."""
        partition = TopicPartition(position.topic, position.partition)
        try:
            low, _high = self._consumer.get_watermark_offsets(partition, cached=True)
            if low < 0:
                low, _high = self._consumer.get_watermark_offsets(partition, timeout=WATERMARK_TIMEOUT_S)
        except KafkaException as error:
            self._log.warning("%s [%d]: the log start is unknown (%s); a loss there is not counted",
                              partition.topic, partition.partition, error.args[0])
            return None
        return low if low >= 0 else None

