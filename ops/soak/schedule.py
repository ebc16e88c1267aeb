"""The run's timetable: how its minutes split into backfill, live and check, and when each fault comes.

Faults come during the backfill, one after the other, each `FAULT_GAP_S` after the one before ended (the pipeline
recovers meanwhile, at full pace), so that the live phase, where flatness is judged, runs undisturbed. A run too
short to hold them all in its backfill lets them run on into the live phase; its flatness windows then start after
the last fault.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .faults import Fault

FAULT_GAP_S = 25.0  # between one fault's end and the next one's start
FIRST_FAULT_S = 45.0  # after publishing began: the pipeline at pace first
KILL_SLOT_S = 30.0  # what a kill takes with its confirmation (supervision starts the program again)
BACKFILL_SHARE = (0.3, 0.6)  # of the publishing time, at least and at most
FLAT_WINDOW_S = 900.0  # the flatness windows: the live phase's first and last 15 minutes, at most


@dataclass(frozen=True)
class Timetable:
    publish_s: float  # from the first row to the last
    backfill_s: float
    live_s: float
    check_reserve_s: float

    def as_dict(self) -> dict[str, float]:
        return {"publish_s": self.publish_s, "backfill_s": self.backfill_s, "live_s": self.live_s,
                "check_reserve_s": self.check_reserve_s}


def check_reserve_s(total_s: float) -> float:
    """Time kept for the pipeline to settle after the last row and for the check: a tenth of the run, within
    1 and 6 minutes."""
    return min(360.0, max(60.0, 0.12 * total_s))


def fault_time_s(faults: Sequence[Fault]) -> float:
    """What the faults take, one after the other, with the gaps between them."""
    return sum((fault.hold_s or KILL_SLOT_S) + FAULT_GAP_S for fault in faults)


def timetable(total_s: float, up_s: float, faults: Sequence[Fault]) -> Timetable:
    reserve = check_reserve_s(total_s)
    publish = max(30.0, total_s - up_s - reserve)
    low, high = BACKFILL_SHARE
    backfill = min(high * publish, max(low * publish, FIRST_FAULT_S + fault_time_s(faults) + 30.0))
    return Timetable(publish, backfill, publish - backfill, reserve)


def fault_starts(faults: Sequence[Fault], timetable_: Timetable) -> list[float]:
    """The planned start of each fault, in seconds after publishing began: spread evenly over the backfill when
    they fit (each still waits for the one before it, `FaultThread`), else back to back."""
    if not faults:
        return []
    room = timetable_.backfill_s - FIRST_FAULT_S - 30.0
    needed = fault_time_s(faults)
    spare = max(0.0, room - needed) / len(faults)
    starts, at = [], FIRST_FAULT_S
    for fault in faults:
        starts.append(at)
        at += (fault.hold_s or KILL_SLOT_S) + FAULT_GAP_S + spare
    return starts


@dataclass(frozen=True)
class Windows:
    """The flatness windows: (start, end) in Unix seconds, or why there are none."""

    first: tuple[float, float] | None
    last: tuple[float, float] | None
    reason: str | None = None


MIN_WINDOW_S = 120.0


def flat_windows(live_from: float, live_to: float, undisturbed_from: float) -> Windows:
    """The live phase's first and last `FLAT_WINDOW_S` (each at most half of its undisturbed part)."""
    start = max(live_from, undisturbed_from)
    length = min(FLAT_WINDOW_S, (live_to - start) / 2)
    if length < MIN_WINDOW_S:
        return Windows(None, None, f"the live phase after the last fault lasted {max(0.0, live_to - start):.0f} s: "
                                   f"too short for two windows of {MIN_WINDOW_S:.0f} s")
    return Windows((start, start + length), (live_to - length, live_to))
