"""The keyed joiner: routes records by thing and join spec to one two-stream join per key.

Built for the standalone exactly-once Kafka joiner. Records are dicts
``{"thing", "quantity", "phenomenonTime" (epoch ms), "result"}`` (or :class:`Record`s with a 'thing'
metadata attribute); each is routed to every (thing, spec binding) whose left or right quantity it is,
and :meth:`KeyedJoiner.ingest` returns what happened to it and the output records it completed (see
:mod:`local_stream_buffer.output` for their shape).

Held records and recovery: a record accepted by any key is *held* until it can no longer pair in any key, then
released through ``on_release(source)``; what an adapter needs to commit below the oldest held record, and to
put the state back after a restart, is :mod:`local_stream_buffer.keyed_state`'s.

Idle release: a spec with ``idle_release_s`` releases what the reorder buffer of a quiet stream holds once that
much processing time (``clock``) passed without its records; :meth:`KeyedJoiner.release_idle`, called while
streams are idle, does it and names each release, so an adapter can record it and apply it again on restore
(:meth:`KeyedJoiner.restore_release`).

The join keys are bounded (``max_join_keys``, :mod:`local_stream_buffer.eviction`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from .clock import END, ClockCounters, ClockedJoin, Held
from .eviction import DEFAULT_MAX_JOIN_KEYS, KeyEviction, evicted_records
from .idle_release import IdleStreams
from .keyed_input import record_fields
from .keyed_state import HeldRecord, KeyedState
from .output import output_builder
from .record import Record
from .rejections import Rejection, order_rejection
from .reorder import ReorderedJoin, late_reason, order_reason
from .specs import JoinSpec, SpecBinding, SpecResolver
from .status import IngestStatus
from .two_stream_join import DEFAULT_MAX_PENDING_PER_SIDE, Entry, TwoStreamJoin

logger = logging.getLogger(__name__)

# Enum members as module constants: attribute access on an Enum class is slow on the hot path.
_ACCEPTED = IngestStatus.ACCEPTED
_DUPLICATE = IngestStatus.DUPLICATE
_REJECTED = IngestStatus.REJECTED
_LATE = IngestStatus.LATE
_UNROUTED = IngestStatus.UNROUTED

OutputRecord = dict[str, Any]


class IngestOutcome(NamedTuple):
    """What became of one ingested record, and the output records it completed (possibly none)."""

    status: IngestStatus
    outputs: list[OutputRecord]
    reason: str | None = None  # why a record was rejected, e.g. "out_of_order: t=... older than last t=..."


# The named tuple's own constructor is Python code; the outcome of every accepted record skips it.
_new_outcome = tuple.__new__


@dataclass
class JoinCounters:
    records_in: int = 0  # every call of ingest
    joins_out: int = 0
    duplicates: int = 0
    rejected: int = 0
    late: int = 0
    forced: int = 0  # pending records resolved early by max_latency_s or the pending limit
    unrouted: int = 0
    evicted_keys: int = 0  # join keys evicted by the key bound (local_stream_buffer.eviction)
    evicted: int = 0  # records those keys held, handed to on_evict
    idle_releases: int = 0  # quiet streams whose reorder buffer was released (idle_release_s)
    clock_outliers: int = 0  # records set aside by the clock rule and dropped as outliers
    clock_steps_back: int = 0  # timelines a stream's clock ended by stepping back (local_stream_buffer.clock)
    clock_jumps_ahead: int = 0  # runs of records set aside ahead that their timeline then took


class IdleRelease(NamedTuple):
    """A quiet stream released: its join key's side gave up everything up to ``up_to_ms`` to the join."""

    thing: str
    binding: SpecBinding
    side: int
    up_to_ms: float


class _KeyJoin:
    """The join of one (thing, binding) key, turning its pairs into output records (under the clock rule, the
    owner its :class:`ClockedJoin` asks, see :class:`local_stream_buffer.clock.ClockOwner`)."""

    __slots__ = ("thing", "binding", "join", "outputs", "_build", "used", "_joiner")

    def __init__(self, thing: str, binding: SpecBinding, joiner: KeyedJoiner) -> None:
        self.thing = thing
        self.binding = binding
        self.outputs: list[OutputRecord] = []
        self.used = joiner._counters.records_in  # the record count at its last record: recency for eviction
        self._build = output_builder(thing, binding)
        self._joiner = joiner
        rule = binding.clock_rule
        self.join = self._line(self._emit, joiner._release) if rule is None else ClockedJoin(self, rule)

    def _line(self, emit: Callable[[int, Entry, Entry], None],
              release: Callable[[Any], None]) -> TwoStreamJoin | ReorderedJoin:
        """The join of the key (of one of its timelines, under the clock rule)."""
        binding = self.binding
        joiner = self._joiner
        join = TwoStreamJoin(
            emit=emit,
            release=release,
            delta_time_ms=binding.delta_time_ms,
            max_pending_per_side=joiner.max_pending_per_side,
            max_latency_s=joiner.max_latency_s,
            clock=joiner.clock,
        )
        if binding.max_out_of_orderness_ms:
            # Bounded disorder: a reorder buffer per side hands the join its streams in time order.
            idle_s = binding.spec.idle_release_s
            arrived = None if idle_s is None else lambda side: joiner._idle.arrived((self, side), idle_s)
            join = ReorderedJoin(join, binding.max_out_of_orderness_ms, release, arrived, binding.idle_release_ms)
        return join

    # What the key's ClockedJoin asks of it (local_stream_buffer.clock.ClockOwner).

    def new_line(self) -> TwoStreamJoin | ReorderedJoin:
        return self._line(self._emit_on_timeline, self._release_on_timeline)

    def release(self, item: HeldRecord) -> None:
        self._joiner._release(item)

    def drop(self, side: int, held: Held, reason: str, outlier: bool) -> None:
        self._joiner._drop(self.thing, self.binding, side, held, reason, outlier)

    def stream(self, side: int) -> str:
        return f"{self.thing}.{self.binding.quantity(side)}"

    def reject_reason(self, join: TwoStreamJoin | ReorderedJoin, side: int, t: float, status: IngestStatus) -> str:
        return self._joiner._rejection(join, self.thing, self.binding.quantity(side), side, t, status)

    def clock_counters(self) -> ClockCounters:
        return self._joiner._clock_faults.setdefault(self.thing, ClockCounters())

    def clock_changed(self) -> None:
        self._joiner._clock_changed.setdefault((self.thing, self.binding))

    def _release_on_timeline(self, item: HeldRecord | None) -> None:
        if item is not None:  # None: the record ending a timeline
            self._joiner._release(item)

    def _emit(self, case: int, left: Entry, right: Entry) -> None:
        self.outputs.append(self._build(case, left[0], left[1], right[0], right[1]))

    def _emit_on_timeline(self, case: int, left: Entry, right: Entry) -> None:
        if left[0] != END and right[0] != END:  # a pair with the end of a timeline is none
            self.outputs.append(self._build(case, left[0], left[1], right[0], right[1]))


class KeyedJoiner(KeyedState, KeyEviction):
    """Joins records of many things and join specs, one deterministic two-stream join per key.

    :param specs: a :class:`SpecResolver`, join specs, or None for the package's default spec file.
    :param max_pending_per_side: pending records per side and key beyond which the oldest are forced.
    :param max_latency_s: processing-time seconds a pending predecessor pair may wait (None: no limit).
    :param clock: processing-time clock in seconds for ``max_latency_s``.
    :param on_release: called with a record's ``source`` when no key holds it any more.
    :param on_late: called with (record, source) for a record that arrived inside a gap closed by forcing.
    :param max_join_keys: keys beyond which the least recently used are evicted (None: no bound; see
        :mod:`local_stream_buffer.eviction`).
    :param on_evict: called per evicted key with its held records (input record dicts, with their sources)
        and the reason, before they are released.
    :param on_dead_letter: called with (input record dict, source, reason) for a record accepted earlier that
        is not joined after all: an outlier of the clock rule, or a record it set aside that the join turned
        away when it took it (see :mod:`local_stream_buffer.clock`). Released after the call.
    """

    def __init__(
        self,
        specs: SpecResolver | Iterable[JoinSpec] | None = None,
        *,
        max_pending_per_side: int = DEFAULT_MAX_PENDING_PER_SIDE,
        max_latency_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_release: Callable[[object], None] | None = None,
        on_late: Callable[[Any, object], None] | None = None,
        max_join_keys: int | None = DEFAULT_MAX_JOIN_KEYS,
        on_evict: Callable[[list[tuple[dict[str, Any], object]], str], None] | None = None,
        on_dead_letter: Callable[[dict[str, Any], object, str], None] | None = None,
    ) -> None:
        self.resolver = specs if isinstance(specs, SpecResolver) else SpecResolver(specs)
        self.max_pending_per_side = max_pending_per_side
        self.max_latency_s = max_latency_s
        self.clock = clock
        self._on_release = on_release
        self._on_late = on_late
        self.max_join_keys = max_join_keys
        self._on_evict = on_evict
        self._keys: dict[tuple[str, SpecBinding], _KeyJoin] = {}
        # (thing, quantity) -> the key joins it feeds: one lookup per record instead of hashing bindings.
        self._streams: dict[tuple[str, str], list[tuple[_KeyJoin, int]]] = {}
        self._held: dict[HeldRecord, None] = {}  # insertion-ordered set of held records
        self._counters = JoinCounters()
        self._idle = IdleStreams(clock)  # streams of specs with an idle release, by their last arrival
        self._clock_faults: dict[str, ClockCounters] = {}  # per thing whose clock the rule caught at something
        self._on_dead_letter = on_dead_letter
        # Keys whose clock rule changed what a restore needs since the last `clock_changes` (insertion-ordered set).
        self._clock_changed: dict[tuple[str, SpecBinding], None] = {}

    def ingest(self, record: Mapping[str, Any] | Record, source: object | None = None) -> IngestOutcome:
        """Route one record to its keys; returns its status and the output records it completed."""
        counters = self._counters
        counters.records_in += 1
        try:
            thing, quantity, t, value = record_fields(record)
        except (KeyError, TypeError, ValueError) as error:
            counters.rejected += 1
            return IngestOutcome(_REJECTED, [], Rejection.INVALID.reason(error=error))
        stream = self._streams.get((thing, quantity))
        if stream is None:
            stream = self._stream_keys(thing, quantity)
            if not stream:
                counters.unrouted += 1
                return IngestOutcome(_UNROUTED, [])
        held = HeldRecord(source)
        if len(stream) == 1:
            # One key, the common case: its verdict is the record's.
            key, side = stream[0]
            key.used = counters.records_in
            held.keys = 1
            status = key.join.ingest(side, t, value, held)
            outputs = key.outputs
            if outputs:
                key.outputs = []
                counters.joins_out += len(outputs)
            else:
                outputs = []
            if status is _ACCEPTED:
                self._held[held] = None
                return _new_outcome(IngestOutcome, (_ACCEPTED, outputs, None))
            return self._not_accepted(record, source, thing, quantity, t, status, status is _LATE, outputs)
        outputs: list[OutputRecord] = []
        status = None  # the first route's verdict, unless any route accepted the record
        late = False
        for key, side in stream:
            key.used = counters.records_in
            held.keys += 1
            verdict = key.join.ingest(side, t, value, held)
            if verdict is _ACCEPTED:
                status = _ACCEPTED
            else:
                held.keys -= 1
                if status is None:
                    status = verdict
                if verdict is _LATE:
                    late = True
            if key.outputs:
                if outputs:
                    outputs.extend(key.outputs)
                    key.outputs.clear()
                else:
                    outputs, key.outputs = key.outputs, outputs
        if held.keys:
            self._held[held] = None
        if outputs:
            counters.joins_out += len(outputs)
        if status is _ACCEPTED and not late:
            return _new_outcome(IngestOutcome, (_ACCEPTED, outputs, None))
        # Every route sees the same stream (thing, quantity), so order verdicts agree; only late differs.
        return self._not_accepted(record, source, thing, quantity, t, status, late, outputs)

    def _not_accepted(self, record: Mapping[str, Any] | Record, source: object, thing: str, quantity: str,
                      t: float, status: IngestStatus, late: bool, outputs: list[OutputRecord]) -> IngestOutcome:
        """The outcome of a record not accepted by every key: counted, and rejected ones with a reason."""
        counters = self._counters
        reason = None
        if status is _DUPLICATE:
            counters.duplicates += 1
        elif status is _REJECTED:
            counters.rejected += 1
            reason = self._order_violation(thing, quantity, self.resolver.routes(quantity)[0], t)
            logger.debug("rejected %s", reason)
        if late:
            counters.late += 1
            if status is _LATE:
                binding, side = self.resolver.routes(quantity)[0]
                reason = late_reason(self._taking(thing, binding, side), thing, quantity, side, t)
            if self._on_late is not None:
                self._on_late(record, source)
        return IngestOutcome(status, outputs, reason)

    def _stream_keys(self, thing: str, quantity: str) -> list[tuple[_KeyJoin, int]]:
        """The key joins (and sides) a stream feeds, creating them on its first record; cached if any."""
        stream = []
        created = False
        for binding, side in self.resolver.routes(quantity):
            key = self._keys.get((thing, binding))
            if key is None:
                key = self._keys[(thing, binding)] = _KeyJoin(thing, binding, self)
                created = True
            stream.append((key, side))
        if created and self.max_join_keys is not None and len(self._keys) > self.max_join_keys:
            self._evict(keep=[(key.thing, key.binding) for key, _ in stream])
        if stream:
            # Bounded by the keys themselves: only streams that feed a key are cached (and evicted with it).
            self._streams[(thing, quantity)] = stream
        return stream

    def poll(self) -> list[OutputRecord]:
        """Emit pairs overdue by ``max_latency_s`` in all keys (call it regularly while streams are idle)."""
        outputs: list[OutputRecord] = []
        if self.max_latency_s is None:
            return outputs
        for key in self._keys.values():
            key.join.poll()
            if key.outputs:
                outputs.extend(key.outputs)
                key.outputs.clear()
        self._counters.joins_out += len(outputs)
        return outputs

    def release_idle(self) -> tuple[list[OutputRecord], list[IdleRelease]]:
        """Release the reorder buffers of streams quiet for their spec's ``idle_release_s``: the output records
        that became certain, and each release made (to record, see :meth:`restore_release`)."""
        outputs: list[OutputRecord] = []
        releases: list[IdleRelease] = []
        for key, side in self._idle.due():
            up_to = key.join.release(side)
            if up_to is None:
                continue  # the watermark had handed everything over already
            releases.append(IdleRelease(key.thing, key.binding, side, up_to))
            if key.outputs:
                outputs.extend(key.outputs)
                key.outputs.clear()
        self._counters.idle_releases += len(releases)
        self._counters.joins_out += len(outputs)
        return outputs, releases

    @property
    def counters(self) -> JoinCounters:
        """A snapshot of the counters."""
        snapshot = JoinCounters(**vars(self._counters))
        snapshot.forced = sum(key.join.forced for key in self._keys.values())
        totals = ClockCounters()
        for faults in self._clock_faults.values():
            totals.add(faults)
        snapshot.clock_outliers, snapshot.clock_steps_back, snapshot.clock_jumps_ahead = totals.as_tuple()
        return snapshot

    def clock_faults(self) -> dict[str, ClockCounters]:
        """Per thing, what the clock rule did to its streams since this joiner started (things it never caught
        at anything are left out)."""
        return {thing: ClockCounters(*faults.as_tuple()) for thing, faults in self._clock_faults.items()}

    def state_size(self) -> int:
        """Buffered entries over all keys (a record held by two keys counts twice)."""
        return sum(len(key.join) for key in self._keys.values())

    def key_count(self) -> int:
        return len(self._keys)

    def _order_violation(self, thing: str, quantity: str, route: tuple[SpecBinding, int], t: float) -> str:
        binding, side = route
        join = self._keys[(thing, binding)].join
        if type(join) is ClockedJoin and join.sets_aside(side, t):
            return order_rejection(thing, quantity, t, t)  # at the time of a record set aside, another result
        return order_reason(self._taking(thing, binding, side), thing, quantity, side, t)

    def _taking(self, thing: str, binding: SpecBinding, side: int) -> TwoStreamJoin | ReorderedJoin:
        """The join a key's side takes its records into (under the clock rule: its timeline's)."""
        join = self._keys[(thing, binding)].join
        return join.taking(side) if type(join) is ClockedJoin else join

    def _rejection(self, join: TwoStreamJoin | ReorderedJoin, thing: str, quantity: str, side: int, t: float,
                   status: IngestStatus) -> str:
        """Why ``join`` turned away a record it was handed (late, or rejected: not a duplicate, which is dropped)."""
        if status is _LATE:
            return late_reason(join, thing, quantity, side, t) or Rejection.LATE.reason()
        return order_reason(join, thing, quantity, side, t)

    def _drop(self, thing: str, binding: SpecBinding, side: int, held: Held, reason: str, outlier: bool) -> None:
        """A record accepted earlier that is not joined after all (the clock rule's): counted, handed over."""
        if not outlier:
            self._counters.rejected += 1
        logger.debug("dropped %s", reason)
        if self._on_dead_letter is not None:
            record = evicted_records(thing, binding, [(side, held[0], held[1])])[0]
            self._on_dead_letter(record, held[2].source, reason)
