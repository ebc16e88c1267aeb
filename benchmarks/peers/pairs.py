"""Pairs of a two-series join, by three semantics, and how a peer's output compares with the engine's.

A pair is named by its key: (thing, output quantity, left time, right time), times in epoch ms. Every
peer writes output records of the engine's shape (thing, quantity, left and right with their times), so
one key function reads all of them. Pure: no I/O.
"""
from __future__ import annotations

import bisect
import dataclasses
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from local_stream_buffer.batch import join_batch
from local_stream_buffer.output import canonical_time
from local_stream_buffer.specs import SpecBinding, SpecResolver


class PairKey(NamedTuple):
    thing: str
    quantity: str
    left_time: int | float
    right_time: int | float


class Series(NamedTuple):
    """The two series of one join key, each as (time, value) in its stream order."""

    thing: str
    binding: SpecBinding
    left: list[tuple[float, float]]
    right: list[tuple[float, float]]


def pair_key(output: Mapping[str, Any]) -> PairKey:
    """The key of one output record (the engine's shape)."""
    return PairKey(output["thing"], output["quantity"], canonical_time(output["left"]["phenomenonTime"]),
                   canonical_time(output["right"]["phenomenonTime"]))


def written_pairs(outputs: Iterable[Mapping[str, Any]]) -> tuple[list[PairKey], int]:
    """The pairs a peer's output records leave standing, and how many records withdrew one.

    An output record of a peer that revises its results (Pathway) carries ``diff``: -1 withdraws one earlier
    record of its pair, which then no longer counts; records without ``diff`` only add."""
    written: Counter[PairKey] = Counter()
    retractions = 0
    for output in outputs:
        key = pair_key(output)
        if output.get("diff", 1) < 0:
            retractions += 1
            written[key] -= 1
        else:
            written[key] += 1
    return [key for key, count in written.items() for _ in range(max(count, 0))], retractions


def series_of(records: Iterable[Mapping[str, Any]], resolver: SpecResolver) -> list[Series]:
    """The records grouped into the series each join key reads, in arrival order (each series' own order)."""
    grouped: dict[tuple[str, SpecBinding], tuple[list, list]] = defaultdict(lambda: ([], []))
    for record in records:
        for binding, side in resolver.routes(record["quantity"]):
            grouped[(record["thing"], binding)][side].append((record["phenomenonTime"], record["result"]))
    return [Series(thing, binding, left, right) for (thing, binding), (left, right) in grouped.items()]


def neighbour_pairs(series: Iterable[Series]) -> set[PairKey]:
    """The engine's pairs (its batch path over each key's whole series): every record with its predecessor
    and successor in the other series, within the spec's delta_time. The reference a peer is held to."""
    pairs: set[PairKey] = set()
    for each in series:
        left, right = (np.array(side, dtype=float).reshape(-1, 2) for side in (each.left, each.right))
        _, found = join_batch(None, left[:, 0], left[:, 1], right[:, 0], right[:, 1],
                              delta_time_ms=each.binding.delta_time_ms)
        pairs.update(PairKey(each.thing, each.binding.output_quantity, canonical_time(lt), canonical_time(rt))
                     for lt, rt in zip(found.left_time.tolist(), found.right_time.tolist()))
    return pairs


def interval_pairs(series: Iterable[Series]) -> set[PairKey]:
    """An interval join's pairs: every left and right record of a key at most delta_time apart."""
    pairs: set[PairKey] = set()
    for each in series:
        delta = _delta_ms(each.binding)
        right_times = sorted(time for time, _ in each.right)
        for left_time, _ in each.left:
            low = bisect.bisect_left(right_times, left_time - delta)
            high = bisect.bisect_right(right_times, left_time + delta)
            pairs.update(PairKey(each.thing, each.binding.output_quantity, canonical_time(left_time),
                                 canonical_time(right_time)) for right_time in right_times[low:high])
    return pairs


def asof_pairs(series: Iterable[Series]) -> set[PairKey]:
    """A backward as-of join's pairs: every left record with the latest right record at or before it, if
    that is at most delta_time earlier."""
    pairs: set[PairKey] = set()
    for each in series:
        delta = _delta_ms(each.binding)
        right_times = sorted(time for time, _ in each.right)
        for left_time, _ in each.left:
            at = bisect.bisect_right(right_times, left_time)
            if at and left_time - right_times[at - 1] <= delta:
                pairs.add(PairKey(each.thing, each.binding.output_quantity, canonical_time(left_time),
                                  canonical_time(right_times[at - 1])))
    return pairs


def _delta_ms(binding: SpecBinding) -> float:
    return float("inf") if binding.delta_time_ms is None else binding.delta_time_ms


@dataclasses.dataclass(frozen=True)
class PairComparison:
    """A peer's output records against the reference pairs."""

    outputs: int  # records written
    found: int  # reference pairs among them
    missing: int  # reference pairs not written
    extra: int  # distinct pairs written that are not reference pairs
    duplicates: int  # records beyond the first of their pair

    @property
    def exact(self) -> bool:
        return self.missing == self.extra == self.duplicates == 0


def compare_pairs(reference: Collection[PairKey], written: Iterable[PairKey]) -> PairComparison:
    """Count found, missing, extra and duplicated pairs of ``written`` against ``reference`` (a set)."""
    counts = Counter(written)
    found = sum(1 for key in counts if key in reference)
    return PairComparison(outputs=sum(counts.values()), found=found, missing=len(reference) - found,
                          extra=len(counts) - found, duplicates=sum(counts.values()) - len(counts))


def same_output(first: Iterable[PairKey], second: Iterable[PairKey]) -> bool:
    """Whether two runs wrote the same pairs, each as often."""
    return Counter(first) == Counter(second)


def output_difference(first: Sequence[PairKey], second: Sequence[PairKey]) -> tuple[int, int]:
    """(pairs only the first run wrote, pairs only the second wrote), as distinct pairs."""
    one, two = set(first), set(second)
    return len(one - two), len(two - one)
