"""How fast the soak publishes and how far each round moves in event time.

The backfill publishes the plant's past at the pipeline's pace: `PaceController` raises the rate while the work
waiting in the pipeline is short, and lowers it while it is long (both measured in seconds of the current rate), so
the pipeline always has work and its queues stay bounded, through faults too. `backfill_step_ms` then spreads the
event time still to cover over the rounds the remaining wall time allows at that rate, so the backfill reaches the
present on time however fast the pipeline turns out to be (a slow pipeline gets a sparser past).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline_core.topics import MACHINE_DATA


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


DAY_MS = 86_400_000


def event_coverage_days(round_times_ms: Sequence[int], max_step_ms: int) -> tuple[float, float]:
    """(days of event time the rounds cover, days they jumped over): a step between rounds longer than the
    backfill's longest (`max_step_ms`) is a jump, not coverage; a backfill that ran out of wall-clock time before
    it reached the present jumps to it where it goes live."""
    times = sorted(round_times_ms)
    steps = [later - earlier for earlier, later in zip(times, times[1:])]
    jumped_ms = sum(step for step in steps if step > max_step_ms)
    return (sum(steps) - jumped_ms) / DAY_MS, jumped_ms / DAY_MS


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

    unknown_by: float = 0.8

    def update(self, at: float, rows_published: float, backlog_rows: float | None) -> float:
        """The rate for the next interval, given the rows published so far and the backlog at `at` (None: unknown,
        as while Kafka does not answer: nothing says the pipeline takes rows, so the rate goes down)."""
        if backlog_rows is None:
            self.rate_rows_s = max(self.min_rows_s, self.rate_rows_s * self.unknown_by)
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


def backlog_rows(sample: Mapping[str, Any] | None, records_base: int) -> float | None:
    """Rows published and not yet through the pipeline, from a monitor sample: those whose records are not yet in
    machine.data (in Mosquitto's queue, in the connector's hands), and the joiner's and DB connector's lags in rows
    (records over the records per row). None while Kafka's offsets are unknown, and while a stage is stale: its
    last report's lag says nothing of a stage frozen or wedged since, whose lag grows unseen."""
    if not sample or sample.get("offsets") is None:
        return None
    if any(values.get("stage_state") == "stale" for values in sample["services"].values()):
        return None
    publisher = sample["publisher"]
    if not publisher["rows_sent"]:
        return 0.0
    per_row = publisher["records_sent"] / publisher["rows_sent"]
    in_kafka = sample["offsets"][MACHINE_DATA.name] - records_base
    lags = sum(values["lag"] or 0 for name, values in sample["services"].items() if name != "stream-connector")
    return max(0.0, publisher["records_sent"] - in_kafka) / per_row + lags / per_row
