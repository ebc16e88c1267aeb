"""How fast the soak publishes and how far each round moves in event time.

The backfill publishes the plant's past at the pipeline's pace: `PaceController` raises the rate while the work
waiting in the pipeline is short, and lowers it while it is long (both measured in seconds of the current rate), so
the pipeline always has work and its queues stay bounded, through faults too. `backfill_step_ms` then spreads the
event time still to cover over the rounds the remaining wall time allows at that rate, so the backfill reaches the
present on time however fast the pipeline turns out to be (a slow pipeline gets a sparser past).
"""
from __future__ import annotations

from dataclasses import dataclass


def backfill_step_ms(event_ms: int, now_ms: int, wall_left_s: float, rate_rows_s: float, machines: int,
                     min_step_ms: int, max_step_ms: int) -> int:
    """The event time between this round and the next: what is left to the present over the rounds left."""
    left_ms = now_ms - event_ms
    if left_ms <= 0:
        return min_step_ms
    rounds_left = rate_rows_s * max(wall_left_s, 0.0) / machines
    if rounds_left < 1:
        return max(min_step_ms, min(max_step_ms, left_ms))
    return max(min_step_ms, min(max_step_ms, round(left_ms / rounds_left)))


@dataclass
class PaceController:
    """The backfill's rate (rows/s): the pipeline's own throughput, plus what brings the backlog (rows published
    and not yet through every stage) towards `target_s` seconds of that throughput within `horizon_s`.

    The throughput is measured where rows leave the pipeline: rows published less the backlog, over time
    (smoothed). The rate never runs more than `headroom` above what the publisher achieved, so a publisher held
    back (its window full while the broker is away) does not wind the rate up."""

    rate_rows_s: float
    min_rows_s: float
    max_rows_s: float
    target_s: float = 20.0
    horizon_s: float = 30.0
    smoothing: float = 0.3
    headroom: float = 1.5
    throughput_rows_s: float | None = None
    _last: tuple[float, float, float] | None = None  # (at, rows published, backlog)

    def update(self, at: float, rows_published: float, backlog_rows: float | None) -> float:
        """The rate for the next interval, given the rows published so far and the backlog at `at` (None:
        unknown, the rate stays)."""
        if backlog_rows is None:
            return self.rate_rows_s
        if self._last is not None and at > self._last[0]:
            elapsed = at - self._last[0]
            left = ((rows_published - backlog_rows) - (self._last[1] - self._last[2])) / elapsed
            published = (rows_published - self._last[1]) / elapsed
            self.throughput_rows_s = max(0.0, left if self.throughput_rows_s is None else
                                         (1 - self.smoothing) * self.throughput_rows_s + self.smoothing * left)
            wanted = self.throughput_rows_s + (self.target_s * self.throughput_rows_s - backlog_rows) / self.horizon_s
            held_back = published < 0.9 * self.rate_rows_s
            self.rate_rows_s = min(wanted, self.headroom * (published if held_back else self.rate_rows_s))
        self._last = (at, rows_published, backlog_rows)
        self.rate_rows_s = max(self.min_rows_s, min(self.max_rows_s, self.rate_rows_s))
        return self.rate_rows_s
