"""What the keyed joiner holds, and how an adapter that keeps it puts it back after a restart.

Offsets: pass the record's Kafka position as ``source``. A record accepted by any key is *held* until it
can no longer pair in any key; then ``on_release(source)`` is called, once. ``held_sources()`` lists what
is still held, so the adapter can commit below the oldest held offset per partition. Records that are
not accepted (duplicate, rejected, late, unrouted) are never held: they are done when ingest returns.

Recovery: without forcing, the engine is a deterministic function of each stream's ordered records, and
pairs of released records cannot recur. Re-ingesting every partition from its oldest held offset
therefore reproduces the same outputs (same ids) for everything after it; the adapter drops those up to
its processed position. An adapter that keeps the held records instead puts them back with
:meth:`KeyedState.restore_ingest`, together with what the clock rule recorded beside them
(:meth:`KeyedState.clock_changes`, :meth:`KeyedState.restore_clock`) and the idle releases it recorded
(:meth:`KeyedState.restore_release`).

`KeyedState` is a base of :class:`local_stream_buffer.keyed.KeyedJoiner` and works on its keys and held
records (``resolver``, ``_keys``, ``_streams``, ``_stream_keys``, ``_held``, ``_clock_changed``, ``_on_release``).
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from .clock import ClockedJoin
from .keyed_input import record_fields
from .record import Record
from .status import IngestStatus

_ACCEPTED = IngestStatus.ACCEPTED
_REJECTED = IngestStatus.REJECTED
_UNROUTED = IngestStatus.UNROUTED


class HeldRecord:
    """A record held by one or more keys; released when the last key lets go of it."""

    __slots__ = ("source", "keys")

    def __init__(self, source: object) -> None:
        self.source = source
        self.keys = 0


class KeyedState:
    """The held records of a :class:`KeyedJoiner`, their release, and the restore of its state."""

    def held_sources(self) -> Iterator[object]:
        """The sources of all records still held, in the order they were ingested."""
        for held in self._held:
            yield held.source

    def held_count(self) -> int:
        """Distinct records held."""
        return len(self._held)

    def _release(self, held: HeldRecord) -> None:
        held.keys -= 1
        if not held.keys:
            del self._held[held]
            if self._on_release is not None:
                self._on_release(held.source)

    def clock_changes(self) -> list[tuple[str, str, str, dict | None]]:
        """Per key whose clock rule changed since the last call: (thing, spec name, axis, what a restore needs
        beyond the held records, with each record named by its source; None: nothing, or the key is gone). An
        adapter that keeps held records keeps these beside them (:meth:`restore_clock`)."""
        changes = []
        for thing, binding in self._clock_changed:
            key = self._keys.get((thing, binding))
            snapshot = key.join.snapshot(lambda held: held.source) if key is not None else None
            if key is not None:
                key.join.recorded = snapshot is not None
            changes.append((thing, binding.spec.name, binding.axis, snapshot))
        self._clock_changed.clear()
        return changes

    def restore_clock(self, thing: str, spec_name: str, axis: str, snapshot: dict) -> bool:
        """Take a key's clock state back (:meth:`clock_changes`), before its held records are restored with
        :meth:`restore_ingest`. False when no join spec of that name with a clock rule exists any more."""
        spec = next((spec for spec in self.resolver.specs if spec.name == spec_name), None)
        if spec is None or spec.clock_confirm_readings == 0:
            return False
        binding = spec.bind(axis)
        if not self._stream_keys(thing, binding.left_quantity) or (thing, binding) not in self._keys:
            return False
        self._keys[(thing, binding)].join.restore(snapshot)
        return True

    def restore_ingest(self, record: Mapping[str, Any] | Record, source: object) -> IngestStatus:
        """A held record put back where it was when its state was kept, in its original order, never judged by the
        clock rule again (it was judged when it came); its outputs were sent then and are dropped now. Call
        :meth:`restored` after the last one."""
        try:
            thing, quantity, t, value = record_fields(record)
        except (KeyError, TypeError, ValueError):
            return _REJECTED
        stream = self._streams.get((thing, quantity)) or self._stream_keys(thing, quantity)
        if not stream:
            return _UNROUTED
        held = HeldRecord(source)
        for key, side in stream:
            held.keys += 1
            join = key.join
            if type(join) is ClockedJoin:
                status = join.place(side, t, value, held, source)
            else:
                status = join.ingest(side, t, value, held)
            if status is not _ACCEPTED:
                held.keys -= 1
            key.outputs.clear()
        if not held.keys:
            return _REJECTED
        self._held[held] = None
        return _ACCEPTED

    def restored(self) -> None:
        """Every held record is back (:meth:`restore_ingest`): timelines a stream had left are ended again."""
        for key in self._keys.values():
            if type(key.join) is ClockedJoin:
                key.join.restored()
                key.outputs.clear()
        self._clock_changed.clear()

    def restore_release(self, thing: str, spec_name: str, axis: str, side: int, up_to_ms: float) -> bool:
        """Apply a recorded idle release again (after the held records were re-ingested): what the stream's buffer
        holds up to ``up_to_ms`` goes to the join, whose outputs are dropped (they went out with the release).
        False when no join spec of that name with a bound exists any more (the release means nothing now)."""
        spec = next((spec for spec in self.resolver.specs if spec.name == spec_name), None)
        if spec is None or not spec.max_out_of_orderness_s or side not in (0, 1):
            return False
        binding = spec.bind(axis)
        if self._stream_keys(thing, binding.quantity(side)) and (thing, binding) in self._keys:
            key = self._keys[(thing, binding)]
            key.join.release(side, up_to_ms)
            key.outputs.clear()
            return True
        return False
