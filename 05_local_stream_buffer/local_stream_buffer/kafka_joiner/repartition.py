"""Co-partitioning by thing: the input is keyed "thing.quantity", so a thing's two joined quantities may
lie in different partitions, owned by different instances of the group. The joiner first forwards each
joinable record, unchanged, to an internal topic partitioned by thing; every join then needs one
partition only, which one instance owns, rebuilds and commits on its own (as Kafka Streams does).

Routing reads the key only (the value is decoded once, by the join side): the partition is a hash of
the key up to its first dot, the same for every quantity of a thing. Keys of quantities that feed no join
spec are not forwarded; records without a usable key are, so the join side can dead-letter them.
"""
from __future__ import annotations

import zlib

from ..specs import SpecResolver

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
