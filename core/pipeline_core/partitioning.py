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
