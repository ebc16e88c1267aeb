"""The join state's changelog: a compacted topic with, per partition of the co-partitioned topic, the
input records its join still holds (as Kafka Streams keeps a store's changelog).

A record is keyed by its place in the co-partitioned partition (`record_position`: its frame's offset and
its index in the frame) and its value is the input record as it came. The transaction that commits a
partition's processed position also writes what changed since the last commit: the records now held that
were not (puts) and the records let go that were held then (tombstones). A record held and let go within
one transaction never reaches the changelog, so a backlog writes a few records per key and commit.

Restoring reads the partition's changelog (read_committed) to its end, keeps the latest value per key, and
re-ingests the held records in their original order: without forcing, the join's state is a function of
the records it holds (the lagging stream's last record, the leading stream's anchor and pending records),
so it comes back as it was at the commit. A put whose tombstone compaction removed while a restore read
the log only adds a record older than its stream's held ones, which the join lets go again at once.

An idle release (a join spec's `idle_release_s`) gave a quiet stream's buffered records to the join: the
transaction that commits its outputs also writes a release record (`release_key`: the stream; value: the time
released up to), which a restore applies after re-ingesting the held records. One per stream, overwritten by
its next release.

A join key whose clock rule holds more than its held records say (records set aside, or its streams on two
timelines; `local_stream_buffer.clock`) has a clock record (`clock_key`: the key; value: its snapshot, JSON, with
records named by their positions), written with the commit after it changed and deleted once the key's streams
agree again. A restore takes the clock records back before re-ingesting the held records, so each held record
goes back where it was, never judged by the rule a second time.

Each commit also writes, per partition, the position its held records cover (`COVERAGE_KEY`): the
committed offset itself. A changelog that covers less than the committed offset (the state topic deleted
or recreated empty) has lost the state; the partition then rebuilds it from its input (`partition_join`).

After the input grew, a thing's records may move to another partition (`handover`): the records its join held in
the old one are written to the new one's changelog as adopted records (`adopted_key`: the place of the thing's
first record there, and their order), which a restore re-ingests just before that record.
"""
from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from pipeline_core.kafka_clients import consumer_config
from pipeline_core.records import DLQ_MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

# Compacted, and compactable soon: the cleaner never touches the active segment, so a restore reads at
# most a minute of changes besides the latest value of every held record. Tombstones go a minute after
# their segment was cleaned (see the module doc for why a restore need not see them all).
STATE_TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.ms": "60000", "delete.retention.ms": "60000",
                      "min.cleanable.dirty.ratio": "0.5",
                      # A held record is an input record, which may be as large as its topic allows.
                      "max.message.bytes": str(DLQ_MAX_MESSAGE_BYTES)}
# A frame holds the records of one consume batch (a few hundred), far below this.
_FRAME_SLOTS = 1 << 16
_RESTORE_BATCH = 10_000
_RESTORE_WARN_S = 15.0


# The key of the record saying up to which offset of its partition the held records are complete (value: the
# offset in ASCII digits). Never a record's position, which is eight bytes.
COVERAGE_KEY = b"covered"
# Keys of release records start with this (never eight bytes long with what follows).
RELEASE_PREFIX = b"released:"
# Keys of clock records start with this (likewise never eight bytes long).
CLOCK_PREFIX = b"clock:"
# Keys of adopted records: this, the position of the thing's first record in the partition (8 bytes), the record's
# place among the adopted ones (4 bytes), and when it fed only some of the join specs where it came from (they
# started after it there: `cohorts`), ":" and their fingerprints.
ADOPTED_PREFIX = b"adopted:"
_ADOPTED_PLACE_END = len(ADOPTED_PREFIX) + 12


def adopted_key(at: int, index: int, feeds: frozenset[str] | None = None) -> bytes:
    """The key of the `index`th record a partition adopts for a thing whose first record there lies at `at`; `feeds`
    the specs it fed where it came from (None: every spec)."""
    key = ADOPTED_PREFIX + at.to_bytes(8, "big") + index.to_bytes(4, "big")
    return key if feeds is None else key + b":" + ",".join(sorted(feeds)).encode()


def _adopted_place(key: bytes | None) -> tuple[int, int] | None:
    """(at, index) of an adopted record's key; None when the key is no such key."""
    if key is None or len(key) < _ADOPTED_PLACE_END or not key.startswith(ADOPTED_PREFIX) or (
            len(key) > _ADOPTED_PLACE_END and key[_ADOPTED_PLACE_END:_ADOPTED_PLACE_END + 1] != b":"):
        return None
    return (int.from_bytes(key[len(ADOPTED_PREFIX):_ADOPTED_PLACE_END - 4], "big"),
            int.from_bytes(key[_ADOPTED_PLACE_END - 4:_ADOPTED_PLACE_END], "big"))


def adopted_position(at: int, index: int) -> int:
    """The place an adopted record takes in its partition's join (negative, before every place of the partition's own
    records): the same at every restore, so a clock record can name it (`handover.moved_clock`)."""
    return -(at * _FRAME_SLOTS + index + 1)


def adopted_feeds(key: bytes) -> frozenset[str] | None:
    """The specs an adopted record fed where it came from (None: every spec)."""
    if len(key) <= _ADOPTED_PLACE_END:
        return None
    return frozenset(key[_ADOPTED_PLACE_END + 1:].decode(errors="replace").split(","))


def release_key(thing: str, spec_name: str, axis: str, side: int) -> bytes:
    """The key of a stream's release record: its join key (thing, spec, axis) and side, as JSON."""
    return RELEASE_PREFIX + json.dumps([thing, spec_name, axis, side]).encode()


def clock_key(thing: str, spec_name: str, axis: str) -> bytes:
    """The key of a join key's clock record: the join key (thing, spec, axis), as JSON."""
    return CLOCK_PREFIX + json.dumps([thing, spec_name, axis]).encode()


def decode_clock(key: bytes, value: bytes) -> tuple[str, str, str, dict]:
    """A clock record's join key and snapshot; ValueError saying why when it is none."""
    try:
        thing, spec_name, axis = json.loads(key[len(CLOCK_PREFIX):])
        snapshot = json.loads(value)
        valid = (isinstance(thing, str) and isinstance(spec_name, str) and isinstance(axis, str)
                 and _is_snapshot(snapshot))
    except (ValueError, TypeError, RecursionError) as error:
        raise ValueError(f"not a clock record ({type(error).__name__}: {error})") from None
    if not valid:
        raise ValueError("not a clock record (a thing, spec and axis, and a snapshot of two sides' timelines, votes "
                         "and records set aside)")
    return thing, spec_name, axis, snapshot


def _is_snapshot(snapshot: object) -> bool:
    def positions(value: object) -> bool:
        return isinstance(value, list) and all(type(position) is int for position in value)

    return (isinstance(snapshot, dict)
            and all(isinstance(snapshot.get(name), list) and len(snapshot[name]) == 2
                    for name in ("line", "votes", "aside", "left_lines"))
            and all(type(number) is int and number >= 0 for name in ("line", "votes") for number in snapshot[name])
            and all(positions(side) for side in snapshot["aside"])
            and all(isinstance(lines, dict) and all(line.isdigit() and positions(held) for line, held in lines.items())
                    for lines in snapshot["left_lines"]))


class Release(NamedTuple):
    """A release record, decoded: the stream and the time (epoch ms) its buffer was released up to."""

    thing: str
    spec_name: str
    axis: str
    side: int
    up_to_ms: float


def decode_release(key: bytes, value: bytes) -> Release:
    """A release record's stream and time; ValueError saying why when it is none."""
    try:
        thing, spec_name, axis, side = json.loads(key[len(RELEASE_PREFIX):])
        up_to_ms = float(value)
    except (ValueError, TypeError, RecursionError) as error:  # RecursionError: nesting deeper than the parser goes
        raise ValueError(f"not a release record ({type(error).__name__}: {error})") from None
    if not (isinstance(thing, str) and isinstance(spec_name, str) and isinstance(axis, str) and side in (0, 1)
            and type(side) is int and math.isfinite(up_to_ms)):
        raise ValueError("not a release record (a thing, spec, axis, side 0 or 1, and a finite time)")
    return Release(thing, spec_name, axis, side, up_to_ms)


def record_position(frame_offset: int, index: int) -> int:
    """The place of a record in its co-partitioned partition: the key of its changelog record."""
    return frame_offset * _FRAME_SLOTS + index


def _key(position: int) -> bytes:
    return position.to_bytes(8, "big")


class StateRecord(NamedTuple):
    """A held record as the changelog has it. Only the joiner writes the changelog, but it is a plain topic:
    a record whose key is no place (`position` None) or whose value is no record is dead-lettered on restore.
    An adopted record's position is negative, one of its own per restore (its key says where it goes)."""

    position: int | None  # its place in the co-partitioned partition, from its key
    key: bytes | None
    offset: int  # in the changelog partition
    value: bytes


def _position(key: bytes | None) -> int | None:
    return int.from_bytes(key, "big") if key is not None and len(key) == 8 else None


class StateChanges:
    """What changed in one partition's held records since its last commit."""

    __slots__ = ("puts", "deletes", "releases", "clocks", "adopted")

    def __init__(self) -> None:
        self.puts: dict[int, bytes | None] = {}  # record position -> input value, held since the last commit
        self.releases: dict[bytes, bytes] = {}  # release records (key -> time released up to) since the last commit
        self.clocks: dict[bytes, bytes | None] = {}  # clock records (key -> snapshot; None: a tombstone) since then
        # Positions of records let go that the changelog holds; a key that is no position: a record dropped on restore.
        self.deletes: list[int | bytes] = []
        self.adopted: dict[int, bytes] = {}  # an adopted record's (negative) position -> its key

    def released(self, position: int) -> None:
        """The join let go of a record (its `on_release` hook)."""
        if position in self.puts:
            del self.puts[position]  # held and let go within one transaction: the changelog never knew it
        elif position < 0:
            self.deletes.append(self.adopted.pop(position))
        else:
            self.deletes.append(position)

    def flush(self, produce_state: Callable[[bytes, bytes | None], None]) -> int:
        """Hand the changes to `produce_state(key, value)` (None: a tombstone) and forget them; returns how many."""
        for position in self.deletes:
            produce_state(position if isinstance(position, bytes) else _key(position), None)
        for position, value in self.puts.items():
            produce_state(_key(position), value)
        for key, value in self.releases.items():
            produce_state(key, value)
        for key, value in self.clocks.items():
            produce_state(key, value)
        count = len(self.deletes) + len(self.puts) + len(self.releases) + len(self.clocks)
        self.deletes.clear()
        self.puts.clear()
        self.releases.clear()
        self.clocks.clear()
        return count


class Restorer:
    """Reads partitions of the changelog to their committed end with a consumer of its own (no group)."""

    def __init__(self, bootstrap_servers: str, group_id: str, topic: str,
                 security: Mapping[str, str] | None = None) -> None:
        self._topic = topic
        self.covered: dict[int, int | None] = {}  # of the partitions last restored: the offset their records cover
        # Of the partitions last restored: their release and clock records (keys that are no record position).
        self.releases: dict[int, list[StateRecord]] = {}
        self._consumer = Consumer(consumer_config(bootstrap_servers, f"{group_id}.restore", **(security or {}), **{
            "enable.partition.eof": True}))

    @property
    def topic(self) -> str:
        return self._topic

    def restore(self, partitions: list[int]) -> tuple[dict[int, list[StateRecord]], int]:
        """Per partition its held records in their original order (those whose key is no position first); and
        how many changelog records were read. The offset each partition's records cover is left in `covered`."""
        latest: dict[int, dict[bytes | None, tuple[int, bytes]]] = {partition: {} for partition in partitions}
        releases: dict[int, dict[bytes, tuple[int, bytes]]] = {partition: {} for partition in partitions}
        self.covered = {}
        if not partitions:
            return {}, 0
        consumer = self._consumer
        consumer.assign([TopicPartition(self._topic, partition, OFFSET_BEGINNING) for partition in partitions])
        unfinished = set(partitions)
        read = 0
        started = warned = time.monotonic()
        try:
            while unfinished:
                # A short wait per call: consume() waits for a full batch or its timeout, and the end comes sooner.
                for message in consumer.consume(_RESTORE_BATCH, 0.1):
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            unfinished.discard(message.partition())
                            continue
                        if error.fatal():
                            raise KafkaException(error)
                        log.warning("restoring %s: %s", self._topic, error)
                        continue
                    read += 1
                    if message.key() == COVERAGE_KEY:
                        self.covered[message.partition()] = _covered_offset(message.value())
                        continue
                    key = message.key()
                    values = (releases if key is not None and key.startswith((RELEASE_PREFIX, CLOCK_PREFIX))
                              else latest)[message.partition()]
                    if message.value() is None:
                        values.pop(message.key(), None)
                    else:
                        values[message.key()] = (message.offset(), message.value())
                if unfinished and time.monotonic() - warned > _RESTORE_WARN_S:
                    # The committed end waits for an open transaction of the partitions' previous owner: the
                    # broker aborts it after the transaction timeout.
                    warned = time.monotonic()
                    log.warning("restoring %s partitions %s for %.0f s: waiting for their committed end",
                                self._topic, sorted(unfinished), warned - started)
        finally:
            consumer.unassign()
        held = {partition: _in_order(values) for partition, values in latest.items()}
        self.releases = {partition: [StateRecord(None, key, offset, value) for key, (offset, value) in values.items()]
                         for partition, values in releases.items() if values}
        return held, read

    def close(self) -> None:
        self._consumer.close()


def _in_order(values: Mapping[bytes | None, tuple[int, bytes]]) -> list[StateRecord]:
    """A partition's held records in their original order: those whose key is no position first, then by place, an
    adopted record just before the first record of its thing that the partition holds itself."""
    placed: list[tuple[tuple[int, int, int], StateRecord]] = []
    for key, (offset, value) in values.items():
        position = _position(key)
        if position is not None:
            placed.append(((position, 1, 0), StateRecord(position, key, offset, value)))
            continue
        place = _adopted_place(key)
        if place is None:
            placed.append(((-1, 0, 0), StateRecord(None, key, offset, value)))
            continue
        placed.append(((place[0], 0, place[1]), StateRecord(adopted_position(*place), key, offset, value)))
    placed.sort(key=lambda item: item[0])
    return [record for _, record in placed]


def coverage_value(offset: int) -> bytes:
    return str(offset).encode()


def _covered_offset(value: bytes | None) -> int | None:
    """The offset a coverage record names; None when it names none (a tombstone, or not digits)."""
    return int(value) if value is not None and value.isdigit() else None
