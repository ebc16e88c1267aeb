"""Co-partitioning by thing: a join needs every quantity of a thing in one partition, which one instance
owns. The rule is the one of `pipeline_core.partitioning` (murmur2 of the thing), as the stream
connector writes `machine.data`.

Input partitioned by key spreads a thing's quantities over partitions: the joiner first forwards each
joinable record, unchanged, to an internal topic partitioned by that rule (as Kafka Streams repartitions
before a join), many records per message (a *frame*). Input already partitioned by thing is joined where
it lies: each record is a frame of its own. Either way the join side reads frames of a co-partitioned
topic, and the admission rule (`pipeline_core.admission`) checks that each record lies in its thing's
partition.
"""
from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple

from confluent_kafka import Message

from pipeline_core.admission import key_text
from pipeline_core.partitioning import placement_history, thing_partition

from local_stream_buffer.specs import SpecResolver
from .progress import JoinerStats

# Distinct keys are things x quantities: small. The bound only guards against a flood of junk keys.
_MAX_CACHED_KEYS = 100_000
# A frame is closed once it holds this much, so however large the input records (up to their topic's
# limit), no frame is larger than one record plus this: the repartition topic takes it (see
# `REPARTITION_TOPIC_CONFIG`), and so does the producer.
FRAME_MAX_BYTES = 512 * 1024


class FramedRecord(NamedTuple):
    """An input record as the join side reads it, with where it lies in the input topic."""

    partition: int
    offset: int
    append_time: int  # ms, 0 when the broker gave none
    key: bytes | None
    value: bytes | None
    # The partition counts its writer placed records by (`pipeline_core.partitioning.PLACEMENT_HEADER`), read
    # where the join reads the input itself; None when it names none, and in frames of the repartition topic.
    placement: tuple[int, ...] | None = None


# The named tuple's own constructor is Python code; one record per input record skips it.
_framed = tuple.__new__


class ThingRouter:
    """Decides for an input key whether a join needs it, and in which partition of a topic of `partitions`
    partitions its thing lies."""

    def __init__(self, resolver: SpecResolver, partitions: int) -> None:
        self._resolver = resolver
        self.partitions = partitions
        self._cache: dict[bytes | None, int | None] = {}

    def partition(self, key: bytes | None) -> int | None:
        """The partition of the thing of a record with this key, or None when no join needs it."""
        try:
            return self._cache[key]
        except KeyError:
            pass
        if len(self._cache) >= _MAX_CACHED_KEYS:
            self._cache.clear()
        partition = self._cache[key] = self._route(key)
        return partition

    def _route(self, key: bytes | None) -> int | None:
        text = key_text(key)
        if text is None:
            return 0  # a key naming nothing: the join side dead-letters the record with the reason
        # One match for the whole key: resolving every suffix after a dot would fill the route cache with
        # the suffixes of every key ever seen.
        thing = self._resolver.joinable_thing(text)
        return None if thing is None else thing_partition(thing, self.partitions)


class InputFrames:
    """Input partitioned by thing: each record is a frame of its own, joined in the partition it lies in."""

    def __init__(self, router: ThingRouter, stats: JoinerStats) -> None:
        self._partition_of = router.partition
        self._stats = stats

    def frame(self, message: Message) -> list[FramedRecord]:
        """A message's input record as a frame; empty when no join needs the record."""
        stats = self._stats
        stats.records_in += 1
        key = message.key()
        if self._partition_of(key) is None:
            return []
        stats.joinable += 1
        append_time = message.timestamp()[1]
        return [_framed(FramedRecord, (message.partition(), message.offset(), append_time if append_time > 0 else 0,
                                       key, message.value(), placement_history(message.headers())))]


# A framed record: source partition, source offset, append time (ms), key length, value length (-1: None).
RECORD_HEADER = struct.Struct("<iqqii")


def frame_parts(parts: list[bytes], partition: int, offset: int, append_time: int, key: bytes | None,
                value: bytes | None) -> None:
    """Append one record's pieces to a frame under construction (``b"".join(parts)`` is the frame).

    Many input records make one message: the hop costs one produce and one fetch per batch, not per record.
    The frame is the unit of progress on the co-partitioned topic (its offset is what is held, replayed and
    committed), which the join only needs per key order for, and frames keep it.
    """
    parts.append(RECORD_HEADER.pack(partition, offset, append_time,
                                    -1 if key is None else len(key), -1 if value is None else len(value)))
    if key:
        parts.append(key)
    if value:
        parts.append(value)


def encode_frame(records: list[FramedRecord]) -> bytes:
    """Many input records as one message (see `frame_parts`)."""
    parts: list[bytes] = []
    for record in records:
        frame_parts(parts, *record[:5])  # a frame names no placement: the joiner routed it by its own count
    return b"".join(parts)


class CorruptFrame(ValueError):
    """A message of the repartition topic that is not a frame `encode_frame` wrote."""


def decode_frame(frame: bytes | None) -> list[FramedRecord]:
    """The records of a frame, in the order they were framed; `CorruptFrame` if it is none."""
    if not frame:
        return []
    unpack = RECORD_HEADER.unpack_from
    size = RECORD_HEADER.size
    records = []
    position = 0
    end = len(frame)
    while position < end:
        if end - position < size:
            raise CorruptFrame(f"{end - position} bytes left at byte {position}, a record header is {size}")
        partition, offset, append_time, key_length, value_length = unpack(frame, position)
        position += size
        if max(key_length, 0) + max(value_length, 0) > end - position:
            raise CorruptFrame(f"a record of {key_length} + {value_length} bytes at byte {position}, "
                               f"{end - position} left")
        key = None
        if key_length >= 0:
            key = frame[position:position + key_length]
            position += key_length
        value = None
        if value_length >= 0:
            value = frame[position:position + value_length]
            position += value_length
        records.append(_framed(FramedRecord, (partition, offset, append_time, key, value, None)))
    return records


def frame_records(frame: bytes | None, partition: int, offset: int, key: bytes | None) -> list[FramedRecord]:
    """The records of a message of the repartition topic. Only the joiner writes that topic, but whatever else
    lands there must not stop it: a message that is no frame is handed on whole, as one record, which the
    join dead-letters as the invalid record it is."""
    try:
        return decode_frame(frame)
    except CorruptFrame:
        return [FramedRecord(partition, offset, 0, key, frame)]


def repartitioned_frame(message: Message) -> list[FramedRecord]:
    """The records of a frame of the repartition topic."""
    return frame_records(message.value(), message.partition(), message.offset(), message.key())


class Forwarder:
    """Stage one with input partitioned by key: frames of the joinable input records per partition of the
    co-partitioned topic, and per input partition the next offset to forward (committed with the frames)."""

    def __init__(self, input_topic: str, router: ThingRouter, stats: JoinerStats) -> None:
        self._input_topic = input_topic
        self._stats = stats
        self._partition_of = router.partition
        self._frames: dict[int, list[bytes]] = {}  # co-partitioned partition -> parts of its frame
        self._frame_bytes: dict[int, int] = {}  # co-partitioned partition -> bytes of its frame so far
        self._full: list[tuple[int, bytes]] = []  # frames closed at FRAME_MAX_BYTES, in order
        self.positions: dict[int, int] = {}  # input partition -> next offset to forward
        self.append_times: dict[int, int] = {}  # input partition -> append time of its last record

    def forward(self, messages: list[Message]) -> list[Message]:
        """Frame the input records among `messages` for their thing's partition (records no join needs are
        skipped); returns the other messages (frames of the co-partitioned topic), in order."""
        input_topic = self._input_topic
        partition_of = self._partition_of
        frames = self._frames
        positions = self.positions
        append_times = self.append_times
        rest = []
        consumed = joinable = 0
        for message in messages:
            if message.topic() != input_topic:
                rest.append(message)
                continue
            key = message.key()
            source = message.partition()
            offset = message.offset()
            append_time = message.timestamp()[1]
            positions[source] = offset + 1
            append_times[source] = append_time
            consumed += 1
            partition = partition_of(key)
            if partition is None:
                continue
            parts = frames.get(partition)
            if parts is None:
                parts = frames[partition] = []
            value = message.value()
            size = self._frame_bytes.get(partition, 0) + len(key or b"") + len(value or b"")
            if size > FRAME_MAX_BYTES and parts:
                self._full.append((partition, b"".join(parts)))
                parts = frames[partition] = []
                size = len(key or b"") + len(value or b"")
            self._frame_bytes[partition] = size
            frame_parts(parts, source, offset, append_time if append_time > 0 else 0, key, value)
            joinable += 1
        self._stats.records_in += consumed
        self._stats.joinable += joinable
        return rest

    def flush(self, produce_frame: Callable[[int, bytes], None]) -> None:
        """Hand every frame under construction to `produce_frame(partition, frame)`."""
        for partition, frame in self._full:
            produce_frame(partition, frame)
        self._full.clear()
        for partition, parts in self._frames.items():
            produce_frame(partition, b"".join(parts))
        self._frames.clear()
        self._frame_bytes.clear()

    def drop(self, partition: int) -> None:
        """Forget an input partition that is no longer ours."""
        self.positions.pop(partition, None)
        self.append_times.pop(partition, None)
