"""Co-partitioning by thing: the input is keyed "thing.quantity", so a thing's two joined quantities may
lie in different partitions, owned by different instances of the group. The joiner first forwards each
joinable record, unchanged, to an internal topic partitioned by thing; every join then needs one
partition only, which one instance owns, rebuilds and commits on its own (as Kafka Streams does).

Records travel in frames (many records per message, see `encode_frame`), unchanged. Routing reads the
key only (the value is decoded once, by the join side): the partition is a hash of
the key up to its first dot, the same for every quantity of a thing. Keys of quantities that feed no join
spec are not forwarded; records without a usable key are, so the join side can dead-letter them.
"""
from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

from local_stream_buffer.specs import SpecResolver

# Distinct keys are things x quantities: small. The bound only guards against a flood of junk keys.
_MAX_CACHED_KEYS = 100_000


class ThingRouter:
    """Decides for an input key whether to forward it, and to which partition of the internal topic."""

    def __init__(self, resolver: SpecResolver, partitions: int) -> None:
        self._resolver = resolver
        self._partitions = partitions
        self._cache: dict[bytes | None, int | None] = {}

    def partition(self, key: bytes | None) -> int | None:
        """The internal partition for a record with this key, or None when no join needs it."""
        try:
            return self._cache[key]
        except KeyError:
            pass
        if len(self._cache) >= _MAX_CACHED_KEYS:
            self._cache.clear()
        partition = self._cache[key] = self._route(key)
        return partition

    def _route(self, key: bytes | None) -> int | None:
        text = _text(key)
        if text is None or "." not in text:
            return 0  # unusable key: the join side dead-letters the record with the reason
        thing_prefix = text.split(".", 1)[0]
        # A thing may contain dots itself, so any suffix after a dot may be the quantity.
        suffixes = (text[index + 1:] for index, char in enumerate(text) if char == ".")
        if not any(self._resolver.routes(suffix) for suffix in suffixes):
            return None
        return zlib.crc32(thing_prefix.encode()) % self._partitions


def _text(key: bytes | None) -> str | None:
    if key is None:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return None


# A framed record: source partition, source offset, append time (ms), key length, value length (-1: None).
RECORD_HEADER = struct.Struct("<iqqii")


class FramedRecord(NamedTuple):
    """An input record inside a frame of the co-partitioned topic, with where it came from."""

    partition: int
    offset: int
    append_time: int
    key: bytes | None
    value: bytes | None


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
        frame_parts(parts, *record)
    return b"".join(parts)


def decode_frame(frame: bytes) -> list[tuple[int, int, int, bytes | None, bytes | None]]:
    """The records of a frame, in the order they were framed, as plain tuples of `FramedRecord`'s fields
    (``FramedRecord._make`` names them where needed: building the named tuple per record costs)."""
    unpack = RECORD_HEADER.unpack_from
    size = RECORD_HEADER.size
    records = []
    position = 0
    end = len(frame)
    while position < end:
        partition, offset, append_time, key_length, value_length = unpack(frame, position)
        position += size
        key = None
        if key_length >= 0:
            key = frame[position:position + key_length]
            position += key_length
        value = None
        if value_length >= 0:
            value = frame[position:position + value_length]
            position += value_length
        records.append((partition, offset, append_time, key, value))
    return records
