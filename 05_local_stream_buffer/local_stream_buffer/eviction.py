"""The bound on join keys: what a flood of distinct things, quantities and axes may cost.

Every (thing, spec binding) a record routes to is a join key with state of its own, and valid input can
name new ones without end. Both joiners apply one rule: a unit of join state (a partition of the standalone
joiner, a bucket of the Spark job) holds at most ``max_join_keys`` keys. Once a new key takes it past that,
the least recently used keys (by their last record) are evicted, down to ``EVICT_DOWN_TO`` of the bound, so
the sort this takes is paid once per tenth of the bound of new keys.

An evicted key gives up whatever it held: each held record could still have paired with a later record of
the key (as its predecessor, or awaiting its own predecessor pair). Those records are counted and
dead-lettered with the reason ``evicted`` (:func:`evicted_records`), and their state is deleted (the
standalone joiner writes changelog tombstones for them). A later record of an evicted key starts it afresh.
Workloads within the bound never evict, and their output stays the deterministic join.

`KeyEviction` applies the rule to the keys of a :class:`local_stream_buffer.keyed.KeyedJoiner`, a base of it that
works on its keys (``_keys``, ``_streams``, ``_idle``, ``_clock_changed``, ``_counters``, ``_on_evict``,
``_release``, ``max_join_keys``); the Spark job applies it to a bucket's stored keys itself.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Hashable, Iterable
from typing import Any

from .clock import ClockedJoin
from .output import canonical_time
from .rejections import Rejection
from .specs import SpecBinding

logger = logging.getLogger(__name__)

# Far above a plant's keys per partition or bucket (10,000 machines of two axes are about 4,000 keys in each of
# the 5 partitions, 1,250 in each of the Spark job's 16 buckets). A key with a few held records costs the
# standalone joiner about 6 kB (see the package README), so the bound caps a partition near 120 MB.
DEFAULT_MAX_JOIN_KEYS = 20_000
EVICT_DOWN_TO = 0.9


def keys_to_evict(last_used: Iterable[tuple[Hashable, float]], count: int, max_join_keys: int,
                  keep: Iterable[Hashable] = ()) -> list[Hashable]:
    """The keys to evict from ``count`` keys (``last_used``: each key and when it last had a record, in any
    unit that grows): none within the bound, else the least recently used down to ``EVICT_DOWN_TO`` of it,
    never one of ``keep`` (the keys of the record being joined)."""
    if count <= max_join_keys:
        return []
    excess = count - int(max_join_keys * EVICT_DOWN_TO)
    kept = set(keep)
    evicted = []
    # By last use; the index keeps the sort from comparing keys.
    for _, _, key in sorted((used, index, key) for index, (key, used) in enumerate(last_used)):
        if len(evicted) == excess:
            break
        if key not in kept:
            evicted.append(key)
    return evicted


def eviction_reason(thing: str, binding: SpecBinding, max_join_keys: int) -> str:
    """Why a held record of an evicted key is dead-lettered."""
    return Rejection.EVICTED.reason(key=f"{thing}/{binding.spec.name}/{binding.axis}", max_join_keys=max_join_keys)


def evicted_records(thing: str, binding: SpecBinding, held: Iterable[tuple[int, float, float]]) -> list[dict[str, Any]]:
    """The held records of an evicted key, ``(side, time in epoch ms, result)`` each, as input records: what its
    dead letters carry, the same from either joiner."""
    return [{"thing": thing, "quantity": binding.quantity(side), "phenomenonTime": canonical_time(t), "result": value}
            for side, t, value in held]


def evicted_payload(record: dict[str, Any]) -> bytes:
    """An evicted record as its dead letter's payload (compact JSON; a non-finite result as the JSON
    extension NaN/Infinity rather than an error: the record is being given up, not joined)."""
    return json.dumps(record, separators=(",", ":")).encode()


class KeyEviction:
    """The bound on a :class:`KeyedJoiner`'s keys."""

    def _evict(self, keep: list[tuple[str, SpecBinding]]) -> None:
        """Evict the least recently used keys down to the bound: their held records go to ``on_evict``, then
        are released (so the adapter deletes their state), and a later record starts the key afresh."""
        evicted = keys_to_evict(((name, key.used) for name, key in self._keys.items()), len(self._keys),
                                self.max_join_keys, keep)
        counters = self._counters
        for name in evicted:
            key = self._keys.pop(name)
            if type(key.join) is ClockedJoin and key.join.recorded:
                self._clock_changed.setdefault(name)  # its clock state goes with it
            thing, binding = name
            for quantity in (binding.left_quantity, binding.right_quantity):
                self._streams.pop((thing, quantity), None)  # other keys of the stream are found again
            entries = [(side, entry) for side in (0, 1) for entry in key.join.buffer(side)]
            self._idle.forget(key)
            counters.evicted_keys += 1
            counters.evicted += len(entries)
            if self._on_evict is not None and entries:
                records = evicted_records(thing, binding, ((side, entry[0], entry[1]) for side, entry in entries))
                self._on_evict([(record, entry[2].source) for record, (_, entry) in zip(records, entries)],
                               eviction_reason(thing, binding, self.max_join_keys))
            for _, entry in entries:
                self._release(entry[2])
        if evicted:
            logger.warning("evicted %d join keys (least recently used, over the bound of %d); %d held records "
                           "evicted in all", len(evicted), self.max_join_keys, counters.evicted)
