"""Counters of the Kafka joiner, commit latency samples, and what its progress reports add to the
counters (`pipeline_core.progress`): the lag and state of the owned partitions, the commit latency."""
from __future__ import annotations

import logging
import math
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from local_stream_buffer.clock import ClockCounters, clock_fault_points, clock_fault_totals
from pipeline_core.progress import ConsumerCounters, Observation

# How the shared reporter's log line names the counters here.
LABELS = {"records_out": "joins out"}


@dataclass
class JoinerStats(ConsumerCounters):
    """Totals since start (records in: consumed from the input topic; records out: join results committed;
    dead letters: records sent to the DLQ); the latency samples are per report."""

    joinable: int = 0  # of the records in, records of a quantity some join spec uses
    joined_in: int = 0  # records ingested by the join (rebuild excluded)
    rebuilt: int = 0  # records re-ingested silently: held records restored from the changelog (or replayed)
    state_records_read: int = 0  # changelog records read to restore them
    rebuild_records_lost: int = 0  # records a rebuild of lost state needed that retention had deleted
    transactions: int = 0
    aborted: int = 0
    producers_replaced: int = 0  # transactional producers replaced after a fatal error or a wedged call
    evicted: int = 0  # held records dead-lettered because the key bound evicted their join key
    first_record_at: float | None = None  # time.monotonic() of the first consumed record
    last_commit_at: float | None = None  # time.monotonic() after the last commit with outputs
    # Append time of the completing input record to the commit of its output, ms; cleared by each report.
    latencies_ms: array = field(default_factory=lambda: array("d"))
    keep_latencies: bool = False  # keep every sample (the benchmark), not only one interval's

    def latency_percentiles(self, *quantiles: float) -> list[float]:
        samples = sorted(self.latencies_ms)
        if not samples:
            return [float("nan")] * len(quantiles)
        return [samples[min(len(samples) - 1, int(q * len(samples)))] for q in quantiles]


class StateFigures(NamedTuple):
    """What the owned partitions hold when a progress report is due."""

    lag: int  # records not yet processed
    held: int  # records held by the joins
    keys: int
    replaying: int  # partitions still replaying input after an upgrade from the earlier state format
    forced: int  # pending records forced out by the pending limit, in total
    # Per machine, what the clock rule did to its streams (outliers, steps back, jumps ahead) in this process.
    clock_faults: Mapping[str, ClockCounters] = {}


class JoinerObservation:
    """The joiner's part of a progress report: lag and state of the owned partitions (None before any are
    owned), the commit latency of the interval, and a warning when the pending limit forced records out."""

    def __init__(self, stats: JoinerStats, figures: Callable[[], StateFigures | None],
                 logger: logging.Logger, waiting_for: Callable[[], str | None] = lambda: None) -> None:
        self._stats = stats
        self._figures = figures
        self._logger = logger
        self._waiting_for = waiting_for
        self._forced_reported = 0

    def __call__(self) -> Observation:
        stats = self._stats
        p50, p99 = (None if math.isnan(value) else value for value in stats.latency_percentiles(0.5, 0.99))
        if not stats.keep_latencies:
            del stats.latencies_ms[:]
        values: dict[str, int | float | None] = {"commit_latency_p50_ms": p50, "commit_latency_p99_ms": p99}
        waiting_for = self._waiting_for()  # a commit Kafka keeps failing: the heartbeat says stuck, not idle
        state = self._figures()
        if state is None:
            return Observation(values=values, waiting_for=waiting_for)
        if state.forced > self._forced_reported:
            # Forcing follows arrival and moves a stream's frontier past its held records, which a restore
            # after a crash does not reproduce: say so loudly.
            self._logger.warning(
                "%d pending records forced out by the pending limit (a stream of a key stalls); their pairs are "
                "exact only if no restart happens before they are released", state.forced)
        self._forced_reported = state.forced
        values.update(held_records=state.held, held_keys=state.keys, replaying_partitions=state.replaying or None,
                      forced=state.forced)
        values.update(clock_fault_totals(state.clock_faults))
        return Observation(lag=state.lag, values=values, waiting_for=waiting_for,
                           machines=clock_fault_points(state.clock_faults))
