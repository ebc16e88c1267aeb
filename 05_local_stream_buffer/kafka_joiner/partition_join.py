"""The join of one partition of the co-partitioned topic: its state, where it commits, and how its frames
are joined into outputs and dead letters.

Per partition the joiner commits, in the transaction of its outputs, two positions:

* the committed offset: the oldest frame (see `repartition`) with a record still held in a join buffer
  (or the processed position when none is held), so a restart re-reads every record the state still needs;
* the processed position (next offset to process), in the committed offset's metadata, so a restart
  knows which of the re-read records already produced their outputs and dead letters.

Frames between the two rebuild the state silently. This is exact because, without forcing, the join is
a deterministic function of each key's two ordered streams: the state after re-reading holds the same
records (every record a key still needs is at or after the committed offset), and pairs of released
records cannot recur. See the package README for the argument in full.
"""
from __future__ import annotations

import json
from collections.abc import Callable

from confluent_kafka import Message, Producer, TopicPartition

from pipeline_core.kafka_clients import produce
from pipeline_core.partitioning import thing_partition
from pipeline_core.records import InvalidRecord, dead_letter, decode_record, encode_record, record_key

from local_stream_buffer.keyed import KeyedJoiner
from local_stream_buffer.output import is_finite_result
from local_stream_buffer.rejections import Rejection
from local_stream_buffer.status import IngestStatus
from .progress import JoinerStats
from .repartition import FramedRecord, misrouted
from .transaction import Transaction

METADATA_PREFIX = "lsb1:processed="
STAGE = "kafka_joiner"
# Records joined between two looks at whether the transaction is due: a batch of records that lie where
# they are joined never commits midway; large frames of the repartition topic commit between them.
_DUE_CHECK_RECORDS = 500
_ACCEPTED = IngestStatus.ACCEPTED
_REJECTED = IngestStatus.REJECTED
_LATE = IngestStatus.LATE


def encode_metadata(processed: int) -> str:
    return f"{METADATA_PREFIX}{processed}"


def decode_metadata(metadata: str | None) -> int | None:
    """The processed position stored with a committed offset; None when absent or not ours."""
    if not metadata or not metadata.startswith(METADATA_PREFIX):
        return None
    try:
        return int(metadata[len(METADATA_PREFIX):])
    except ValueError:
        return None


class PartitionJoin:
    """The keyed join of one co-partitioned partition, rebuilt from its committed offset on assignment.

    :param committed: the committed offset (None: nothing committed, start at the beginning).
    :param processed: the processed position from the commit's metadata; frames below it rebuild silently.
    """

    __slots__ = ("topic", "partition", "joiner", "committed", "processed", "position")

    def __init__(self, topic: str, partition: int, joiner: KeyedJoiner, committed: int | None,
                 processed: int | None) -> None:
        self.topic = topic
        self.partition = partition
        self.joiner = joiner
        self.committed = committed
        # Without metadata (first run, or offsets committed by something else) nothing is replayed silently.
        self.processed = processed if processed is not None and committed is not None else committed
        self.position: int | None = None  # next offset to ingest, once a frame arrived

    def advance(self, offset: int) -> None:
        self.position = offset + 1
        if self.processed is None or self.position > self.processed:
            self.processed = self.position

    @property
    def rebuilding(self) -> bool:
        return self.processed is not None and (self.position or self.committed or 0) < self.processed

    def commit_position(self) -> TopicPartition | None:
        """The offset (oldest held frame) and metadata (processed position) to commit, if anything moved."""
        if self.position is None:
            return None
        if self.rebuilding:
            # Mid-rebuild the held set is incomplete: keep the offset the rebuild started from.
            offset = self.committed
        else:
            oldest = next(iter(self.joiner.held_sources()), None)
            offset = self.processed if oldest is None else oldest
        return TopicPartition(self.topic, self.partition, offset, metadata=encode_metadata(self.processed))


class FrameJoiner:
    """Joins frames of the co-partitioned topic into their partition's join; produces the outputs and dead
    letters of records processed for the first time into the open transaction.

    :param frames_of: the records of each message of the co-partitioned topic (a frame, or one input record).
    :param partitions: partitions of the co-partitioned topic (a record lies in its thing's partition).
    """

    def __init__(self, producer: Producer, transaction: Transaction, stats: JoinerStats, input_topic: str,
                 output_topic: str, dlq_topic: str, frames_of: Callable[[list[Message]], list[list[FramedRecord]]],
                 partitions: int) -> None:
        self._producer = producer
        self._transaction = transaction
        self._stats = stats
        self._input_topic = input_topic
        self._output_topic = output_topic
        self._dlq_topic = dlq_topic
        self._frames_of = frames_of
        self._partitions = partitions

    def join(self, messages: list[Message], joins: dict[int, PartitionJoin]) -> int:
        """Join the frames among `messages` in order, each into its partition's join, until the transaction
        is due (checked every few hundred records); returns how many messages were handled.

        Each record is held as the offset of its frame. Below the processed position records rebuild the
        state silently; from there on they produce outputs and dead letters. (One loop over all records of
        the batch: it is the hot path, run once per input record.)
        """
        transaction = self._transaction
        append_times = transaction.append_times
        produce_output = self._producer.produce
        output_topic = self._output_topic
        partitions = self._partitions
        joined = rebuilt = records_since_check = 0
        join: PartitionJoin | None = None
        current = -1  # the partition `join` belongs to
        frame_offset = -1  # of the last frame joined into `join`, which advances past it on a change
        for index, (message, frame) in enumerate(zip(messages, self._frames_of(messages))):
            partition = message.partition()
            if partition != current:
                if frame_offset >= 0:
                    join.advance(frame_offset)
                    frame_offset = -1
                current = partition
                join = joins.get(partition)
                if join is not None:
                    ingest = join.joiner.ingest
                    replay_below = join.processed if join.processed is not None else -1
            if join is None:
                continue  # not ours (any more): whoever owns the partition reads it
            frame_offset = message.offset()
            replay = frame_offset < replay_below
            for framed in frame:
                records_since_check += 1
                try:
                    record = decode_record(framed.value)
                    thing = record["thing"]
                    expected_key = record_key(thing, record["quantity"])
                    if framed.key != expected_key.encode():
                        raise InvalidRecord(f"key {framed.key!r} does not match {expected_key!r}")
                    if thing_partition(thing, partitions) != partition:
                        raise misrouted(thing, partition, partitions)
                except InvalidRecord as error:
                    if not replay:
                        self._dead_letter(str(error), framed)
                    continue
                status, outputs, reason = ingest(record, frame_offset)
                if replay:
                    rebuilt += 1
                    continue
                joined += 1
                if status is not _ACCEPTED:
                    if status is _REJECTED:
                        self._dead_letter(reason or "rejected", framed)
                    elif status is _LATE:
                        self._dead_letter(Rejection.LATE.reason(), framed)
                for output in outputs:
                    if not is_finite_result(output):
                        self._dead_letter(Rejection.NOT_FINITE.reason(), framed,
                                          output=json.dumps(output, default=repr))
                        continue
                    payload = encode_record(output)
                    key = record_key(output["thing"], output["quantity"])
                    try:
                        produce_output(output_topic, payload, key)
                    except BufferError:  # local queue full: the shared helper waits for deliveries to drain it
                        produce(self._producer, output_topic, payload, key)
                    append_times.append(framed.append_time)
            if records_since_check >= _DUE_CHECK_RECORDS:
                transaction.records += records_since_check
                records_since_check = 0
                if transaction.due():
                    index += 1
                    break
        else:
            index = len(messages)
        if frame_offset >= 0:
            join.advance(frame_offset)
        transaction.records += records_since_check
        self._stats.joined_in += joined
        self._stats.rebuilt += rebuilt
        return index

    def _dead_letter(self, reason: str, framed: FramedRecord, **context: object) -> None:
        key = framed.key
        envelope = dead_letter(reason, framed.value, STAGE, topic=self._input_topic,
                               partition=framed.partition, offset=framed.offset,
                               key=key.decode("utf-8", "replace") if key is not None else None, **context)
        produce(self._producer, self._dlq_topic, envelope, key)
        self._stats.dead_letters += 1
