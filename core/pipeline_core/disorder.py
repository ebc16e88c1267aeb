"""Bounded disorder: the one displacement of event times into an arrival order, for the simulator's
`--disorder-ms` and the benchmarks' disordered workloads, so that one seed gives one arrival order in both."""
from __future__ import annotations

import random
from collections.abc import Sequence


def arrival_order(times_ms: Sequence[float], disorder_ms: int, seed: int) -> list[int]:
    """The indices of `times_ms` (rows in time order) in arrival order: each row is held back by a seeded
    random whole 0 to `disorder_ms` ms of event time and the rows go by that arrival time. On equal arrival
    times the later row goes first, so the full displacement occurs; then the rows' own order.

    A row then arrives after a later row only if that row is at most `disorder_ms` later: no row comes more than
    `disorder_ms` of event time behind the newest row before it (a join spec's `max_out_of_orderness_s` of at
    least as much absorbs it)."""
    if disorder_ms < 0:
        raise ValueError("the disorder bound must not be negative")
    if not disorder_ms:
        return list(range(len(times_ms)))
    draw = random.Random(seed).randint
    arrival = [(time_ms + draw(0, disorder_ms), -time_ms, index) for index, time_ms in enumerate(times_ms)]
    return [index for _, _, index in sorted(arrival)]
