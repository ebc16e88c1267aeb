"""What the join turns away, releases and gives up, by its contract, computed offline: the oracle of the property
tests that drive the engine (tests/unit/test_join_against_reference.py). Like join_reference, whose pairs it uses,
it shares no code with either joiner (nothing of local_stream_buffer, kafka_joiner or spark_joiner is imported):
it is written from 05_local_stream_buffer/README.md ("In-order premise, duplicates, stalls", "Bounded disorder",
"A quiet machine's last pairs", "The key bound", "State and memory") and the docstrings of local_stream_buffer's
reorder, idle_release and eviction modules.

A stream is one thing's records of one quantity that a spec joins; its records arrive in arrival order. Every
stream here keeps to its clock (`clocks_kept`): the clock rule (docs/join.md, "Clocks that lie") sets none of its
records aside, so it takes each as it comes, and what follows is the join's. Where a clock lies, join_reference
alone says what is joined.

The verdict on each arriving record (`Verdict`), against the records of its stream accepted before it:
- more than the bound (max_out_of_orderness) behind the newest of them, or at or before the time an idle release
  gave the stream up to: `BEHIND` (with a bound above 0 the engine calls it late; with none, out of order);
- at the time of one of them: the same result a `DUPLICATE` (dropped), another a `CONFLICT` (rejected); the
  first stays;
- else `ACCEPTED`. A record of a quantity no spec joins is `UNROUTED`.

Idle release (a spec's idle_release_s, processing time): whenever the joiner looks for quiet streams
(`ReleaseCheck`), a stream whose last record (whatever became of it) arrived at least idle_release_ms before and
that holds records the bound keeps back (accepted, after its watermark: its newest is one) is released up to its
newest time. The join then sees, per stream, its accepted records at or before max(newest - bound, released up
to), and the pairs are the join's pairs of those (join_reference).

The key bound (max_join_keys, per unit of join state; in-order streams, bound 0): each (thing, spec, axis) a
record routes to is a key. When a record's new key takes the count past the bound, the least recently used keys
(by their last record, whatever became of it), never the record's own, are evicted down to int(0.9 x bound). An
evicted key gives up what it held, dead-lettered: its lagging stream's last record (the stream with the smaller
frontier, its last time), the leading stream's anchor (its latest record at or before the lagging frontier) and
its pending records (after that frontier); with equal frontiers each stream's last record. A later record of the
key starts it afresh. The outputs are each incarnation's own join.
"""
from __future__ import annotations

import dataclasses
import enum
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from join_reference import Spec, reference_join


class Verdict(enum.Enum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"
    BEHIND = "behind"  # late (a bound above 0, or released up to), or out of order (no bound)
    UNROUTED = "unrouted"


@dataclass(frozen=True)
class Arrival:
    """A record arriving at the joiner at processing time `at_ms`."""

    at_ms: float
    record: dict[str, Any]


@dataclass(frozen=True)
class ReleaseCheck:
    """The joiner looking for quiet streams at processing time `at_ms` (its idle release)."""

    at_ms: float


Event = Arrival | ReleaseCheck
StreamId = tuple[str, str, str, str]  # thing, spec's output prefix, axis, side ("left" | "right")
KeyId = tuple[str, str, str]  # thing, spec's output prefix, axis


def routes(quantity: str, specs: Sequence[Spec]) -> list[tuple[Spec, str, str]]:
    """The (spec, axis, side) a quantity feeds: its name is a spec's left or right prefix and an axis number."""
    found = []
    for spec in specs:
        for prefix, side in ((spec.left, "left"), (spec.right, "right")):
            if matched := re.fullmatch(re.escape(prefix) + r"(\d+)", quantity):
                found.append((spec, matched.group(1), side))
    return found


@dataclass
class _Stream:
    newest: float = -math.inf
    released_to: float = -math.inf
    accepted: dict[float, dict[str, Any]] = field(default_factory=dict)
    last_arrival_ms: float | None = None

    def verdict(self, record: dict[str, Any], bound_ms: float) -> Verdict:
        t = record["phenomenonTime"]
        if t < self.newest - bound_ms or t <= self.released_to:
            return Verdict.BEHIND
        if t in self.accepted:
            return Verdict.DUPLICATE if self.accepted[t]["result"] == record["result"] else Verdict.CONFLICT
        return Verdict.ACCEPTED

    def accept(self, record: dict[str, Any]) -> None:
        self.accepted[record["phenomenonTime"]] = record
        self.newest = max(self.newest, record["phenomenonTime"])

    def certain(self, bound_ms: float) -> list[dict[str, Any]]:
        """The accepted records the join has seen: at or before the watermark, or what a release gave up."""
        up_to = max(self.newest - bound_ms, self.released_to)
        return [record for t, record in sorted(self.accepted.items()) if t <= up_to]


def clocks_kept(records: Iterable[dict[str, Any]], specs: Sequence[Spec], bound_ms: float) -> bool:
    """Whether the clock rule of each spec (its limits in join_reference's Spec; clock_confirm 0: none) sets no record
    aside: each record of a stream within clock_ahead_ms ahead of, and bound_ms + clock_back_ms behind, the newest
    record of the stream before it (its timeline's newest: nothing set aside, the timeline took them all)."""
    newest: dict[StreamId, float] = {}
    for record in records:
        t = record["phenomenonTime"]
        for spec, axis, side in routes(record["quantity"], specs):
            if not spec.clock_confirm:
                continue
            stream = (record["thing"], spec.output, axis, side)
            if stream in newest and not (newest[stream] - bound_ms - spec.clock_back_ms <= t
                                         <= newest[stream] + spec.clock_ahead_ms):
                return False
            newest[stream] = max(newest.get(stream, t), t)
    return True


def _verdict_of(verdicts: Iterable[Verdict]) -> Verdict:
    """One record's verdict over its streams (every stream of one quantity agrees, as they hold the same records)."""
    found = set(verdicts)
    assert len(found) <= 1, f"the streams of one quantity disagree: {found}"
    return found.pop() if found else Verdict.UNROUTED


@dataclass(frozen=True)
class Release:
    at_ms: float
    stream: StreamId
    up_to: float


@dataclass
class JoinResult:
    outputs: list[dict[str, Any]]  # the output records, in no particular order
    verdicts: list[Verdict]  # per Arrival, in event order
    releases: list[Release] = field(default_factory=list)
    evicted: list[list[dict[str, Any]]] = field(default_factory=list)  # per eviction of a key: what it held


def _pairs(streams: dict[StreamId, _Stream], specs: Sequence[Spec], bound_ms: float) -> list[dict[str, Any]]:
    """The join of what each stream's join has seen, by join_reference's definition of the pairs."""
    outputs = []
    for spec in specs:
        records = [record for (_, prefix, _, _), stream in streams.items() if prefix == spec.output
                   for record in stream.certain(bound_ms)]
        # Each stream in time order, every record at or before its newest: the reference takes them all.
        outputs += reference_join(sorted(records, key=lambda r: r["phenomenonTime"]),
                                  dataclasses.replace(spec, bound_ms=0.0))
    return outputs


def released_join(events: Iterable[Event], specs: Sequence[Spec], bound_ms: float,
                  idle_release_ms: float | None = None, pairs: bool = True) -> JoinResult:
    """The verdicts and outputs of `events` (arrivals and the joiner's looks for quiet streams), every spec with
    `bound_ms` and `idle_release_ms` (None: never released). Without releases, the join of reference_join with
    the bound, plus the verdicts. `pairs` False: the verdicts and releases alone."""
    events = list(events)
    assert clocks_kept((event.record for event in events if isinstance(event, Arrival)), specs, bound_ms), \
        "a stream whose clock the clock rule would not keep: beyond this reference's contract"
    streams: dict[StreamId, _Stream] = {}
    verdicts: list[Verdict] = []
    releases: list[Release] = []
    for event in events:
        if isinstance(event, ReleaseCheck):
            if idle_release_ms is None:
                continue
            for name, stream in streams.items():
                if (stream.last_arrival_ms is not None and event.at_ms - stream.last_arrival_ms >= idle_release_ms
                        and stream.newest > stream.released_to):
                    stream.released_to = stream.newest
                    releases.append(Release(event.at_ms, name, stream.newest))
            continue
        record = event.record
        fed = [streams.setdefault((record["thing"], spec.output, axis, side), _Stream())
               for spec, axis, side in routes(record["quantity"], specs)]
        verdict = _verdict_of(stream.verdict(record, bound_ms) for stream in fed)
        for stream in fed:
            stream.last_arrival_ms = event.at_ms
            if verdict is Verdict.ACCEPTED:
                stream.accept(record)
        verdicts.append(verdict)
    return JoinResult(_pairs(streams, specs, bound_ms) if pairs else [], verdicts, releases)


def held_records(left: list[dict[str, Any]], right: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a key of in-order streams holds (README, "State and memory"), given each stream's accepted records in
    time order: the lagging stream's last record, the leading stream's anchor and pending records."""
    frontier = [records[-1]["phenomenonTime"] if records else -math.inf for records in (left, right)]
    if frontier[0] == frontier[1]:
        return [records[-1] for records in (left, right) if records]
    lagging, leading = ((left, right) if frontier[0] < frontier[1] else (right, left))
    lag_frontier = min(frontier)
    held = [lagging[-1]] if lagging else []
    before = [record for record in leading if record["phenomenonTime"] <= lag_frontier]
    return held + before[-1:] + [record for record in leading if record["phenomenonTime"] > lag_frontier]


def evicting_join(records: Iterable[dict[str, Any]], specs: Sequence[Spec], max_join_keys: int) -> JoinResult:
    """The verdicts, outputs and evictions of in-order streams (bound 0) through one unit of join state holding at
    most `max_join_keys` keys."""
    records = list(records)
    assert clocks_kept(records, specs, 0.0), "a stream whose clock the clock rule would not keep: beyond this reference"
    keys: dict[KeyId, dict[str, _Stream]] = {}  # the live incarnation of each key: its two streams
    last_used: dict[KeyId, int] = {}
    outputs: list[dict[str, Any]] = []
    verdicts: list[Verdict] = []
    evicted: list[list[dict[str, Any]]] = []
    by_output = {spec.output: spec for spec in specs}

    def close(key: KeyId) -> list[dict[str, Any]]:
        """The key's incarnation ends: its join's outputs; returns what it held."""
        sides = keys.pop(key)
        last_used.pop(key)
        accepted = {side: [r for _, r in sorted(stream.accepted.items())] for side, stream in sides.items()}
        outputs.extend(reference_join(sorted(accepted["left"] + accepted["right"],
                                             key=lambda r: r["phenomenonTime"]),
                                      dataclasses.replace(by_output[key[1]], bound_ms=0.0)))
        return held_records(accepted["left"], accepted["right"])

    for index, record in enumerate(records):
        fed = routes(record["quantity"], specs)
        own = [(record["thing"], spec.output, axis) for spec, axis, _ in fed]
        created = False
        for key in own:
            if key not in keys:
                keys[key] = {"left": _Stream(), "right": _Stream()}
                last_used[key] = index
                created = True
        if created and len(keys) > max_join_keys:
            excess = len(keys) - int(max_join_keys * 0.9)
            by_recency = sorted((key for key in keys if key not in own), key=last_used.__getitem__)
            for key in by_recency[:excess]:
                evicted.append(close(key))
        streams = [keys[key][side] for key, (_, _, side) in zip(own, fed)]
        verdict = _verdict_of(stream.verdict(record, 0.0) for stream in streams)
        for key, stream in zip(own, streams):
            last_used[key] = index
            if verdict is Verdict.ACCEPTED:
                stream.accept(record)
        verdicts.append(verdict)
    for key in list(keys):
        close(key)
    return JoinResult(outputs, verdicts, evicted=evicted)
