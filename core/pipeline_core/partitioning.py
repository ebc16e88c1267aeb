"""Partitioning by thing: every quantity of a machine in one partition of machine.data.

Records are keyed by thing and quantity (`pipeline_core.record_keys`), so Kafka's default partitioner
spreads a machine's speed and torque over different partitions, and a join of the two must first repartition
them. The stream connector instead chooses the partition from the thing alone, the partition Kafka's default
partitioner (murmur2) gives the key ``"<thing>"``, the thing's own UTF-8 (not its escape in a record key): a
joiner then finds both streams of a key in one partition and joins them where they lie. Keys, and with them
each series' order, stay as they are.
"""
from __future__ import annotations

import functools

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash (`org.apache.kafka.common.utils.Utils.murmur2`), as an unsigned 32-bit int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length - length % 4
    for index in range(0, whole, 4):
        k = int.from_bytes(data[index:index + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length - whole
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


# A plant of 100,000 machines fits: an LRU cache smaller than the things a batch names misses every time.
@functools.lru_cache(maxsize=1 << 17)
def thing_partition(thing: str, partitions: int) -> int:
    """The partition of every record of `thing` in a topic of `partitions` partitions (cached: a
    pipeline sees few things, and this runs once per record)."""
    return (murmur2(thing.encode("utf-8")) & 0x7FFFFFFF) % partitions


# -- growth --------------------------------------------------------------------------------------------------------
# A topic grown from 5 to 8 partitions moves most things to another partition (`thing_partition`), while records of
# theirs may still wait in the old one. So every record names, in this header, the partition counts its writer has
# placed records with, oldest first (`b"5,8"`): the last is the count its own partition was chosen by. A reader can
# tell where the thing's earlier records lie (the counts before), and whether the record lies where it was put
# (`pipeline_core.admission`); a record without the header was placed by a writer that predates it.
PLACEMENT_HEADER = "partitions"
# Counts a history names at most: far beyond the growths of a topic's life, a bound on what a header can make a
# reader hold.
MAX_PLACEMENT_HISTORY = 64


def placement_value(history: tuple[int, ...]) -> bytes:
    """The header's value for a writer that has placed records with these partition counts, oldest first."""
    return ",".join(str(count) for count in history).encode()


@functools.lru_cache(maxsize=1024)
def _parsed_history(value: bytes) -> tuple[int, ...] | None:
    try:
        counts = tuple(int(part) for part in value.split(b",", MAX_PLACEMENT_HISTORY))
    except ValueError:
        return None
    if not counts or len(counts) > MAX_PLACEMENT_HISTORY or any(count < 1 for count in counts):
        return None
    return counts


def placement_history(headers: list[tuple[str, bytes | None]] | None) -> tuple[int, ...] | None:
    """The partition counts a record's header names (the last: the one its partition was chosen by); None when
    it names none, or nothing readable (a record is judged by the reader's own count then)."""
    if not headers:
        return None
    for name, value in headers:
        if name == PLACEMENT_HEADER:
            return _parsed_history(value) if isinstance(value, bytes) else None
    return None


def earlier_homes(thing: str, history: tuple[int, ...]) -> list[int]:
    """Where `thing`'s records placed by the counts before the last of `history` lie, latest first, each once,
    without the partition its latest records lie in."""
    home = thing_partition(thing, history[-1])
    homes: list[int] = []
    for count in reversed(history[:-1]):
        partition = thing_partition(thing, count)
        if partition != home and partition not in homes:
            homes.append(partition)
    return homes
