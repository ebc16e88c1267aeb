"""Machines of the plant whose clocks lie, as docs/join.md ("Clocks that lie") describes them: a row stamped far
off while the rows around it agree (an outlier, which the joiners dead-letter `clock_outlier`), and a clock that
moves and stays (a step back starts a new timeline, a step ahead is followed as after a pause).

A fault hits one machine at a moment of the run (seconds after publishing began); the publisher applies it to that
machine's next row and notes, round by round, each machine's offset (`rounds.jsonl`), which the check adds to the
times it expects. Offsets carry an odd number of milliseconds, so a stepped clock never stamps a row on the time
of one of the machine's earlier rows (two records would be one InfluxDB point).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

HOUR_MS = 3_600_000

# (kind, offset): an outlier ahead and one behind, a clock set back an hour and one set ahead two, each for the
# rest of the run.
FAULTS = (("outlier", 24 * HOUR_MS + 7), ("outlier", -2 * HOUR_MS - 13), ("step", -HOUR_MS - 123),
          ("step", 2 * HOUR_MS + 311))


@dataclass(frozen=True)
class ClockFault:
    machine: int
    at_s: float  # after publishing began
    kind: str  # outlier: one row off; step: every row from then on
    offset_ms: int


def plan_clock_faults(machines: int, probes: Sequence[int], backfill_s: float) -> list[ClockFault]:
    """One machine per kind of `FAULTS` (none of the probes, whose rows time the latency), each in the middle
    of the backfill, a little apart."""
    candidates = [machine for machine in range(machines - 1, -1, -1) if machine not in set(probes)]
    return [ClockFault(machine, backfill_s * (0.4 + 0.05 * index), kind, offset)
            for index, ((kind, offset), machine) in enumerate(zip(FAULTS, candidates))]


class Clocks:
    """Each machine's clock offset, round by round, as the publisher applies the faults."""

    def __init__(self, faults: Sequence[ClockFault]) -> None:
        self.pending = sorted(faults, key=lambda fault: fault.at_s)
        self.steps: dict[int, int] = {}

    def offsets(self, elapsed_s: float) -> dict[int, int]:
        """The offsets of this round's rows (machines without one left out)."""
        outliers: dict[int, int] = {}
        while self.pending and self.pending[0].at_s <= elapsed_s:
            fault = self.pending.pop(0)
            if fault.kind == "step":
                self.steps[fault.machine] = self.steps.get(fault.machine, 0) + fault.offset_ms
            else:
                outliers[fault.machine] = fault.offset_ms
        found = dict(self.steps)
        for machine, offset in outliers.items():
            found[machine] = found.get(machine, 0) + offset
        return found
