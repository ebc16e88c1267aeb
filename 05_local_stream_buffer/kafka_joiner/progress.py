"""Counters of the Kafka joiner, commit latency samples, and the periodic progress line."""
from __future__ import annotations

import logging
import time
from array import array
from dataclasses import dataclass, field
from typing import NamedTuple


@dataclass
class JoinerStats:
    """Totals since start; rates and latency percentiles are per log interval."""

    records_in: int = 0  # records consumed from the input topic
    joinable: int = 0  # of those, records of a quantity some join spec uses
    joined_in: int = 0  # records ingested by the join (rebuild excluded)
    rebuilt: int = 0  # records re-ingested silently: held records restored from the changelog (or replayed)
    state_records_read: int = 0  # changelog records read to restore them
    joins_out: int = 0  # output records committed
    dead_letters: int = 0  # records sent to the DLQ
    transactions: int = 0
    aborted: int = 0
    first_record_at: float | None = None  # time.monotonic() of the first consumed record
    last_commit_at: float | None = None  # time.monotonic() after the last commit with outputs
    # Append time of the completing input record to the commit of its output, ms; cleared by the log line.
    latencies_ms: array = field(default_factory=lambda: array("d"))
    keep_latencies: bool = False  # keep every sample (the benchmark), not only one interval's

    def latency_percentiles(self, *quantiles: float) -> list[float]:
        samples = sorted(self.latencies_ms)
        if not samples:
            return [float("nan")] * len(quantiles)
        return [samples[min(len(samples) - 1, int(q * len(samples)))] for q in quantiles]


class StateFigures(NamedTuple):
    """What the owned partitions hold when a progress line is written."""

    lag: int  # records not yet processed
    held: int  # records held by the joins
    keys: int
    replaying: int  # partitions still replaying input after an upgrade from the earlier state format
    forced: int  # pending records forced out by the pending limit, in total


class ProgressLog:
    """Logs a line every `interval_s` with records in, joins out, DLQ count, lag, state size, latency."""

    def __init__(self, logger: logging.Logger, stats: JoinerStats, interval_s: float) -> None:
        self._logger = logger
        self._stats = stats
        self._interval = interval_s
        self._last_at = time.monotonic()
        self._last_records = 0
        self._last_joins = 0
        self._forced_reported = 0

    def due(self, now: float) -> bool:
        return now - self._last_at >= self._interval

    def log(self, now: float, state: StateFigures) -> None:
        stats = self._stats
        elapsed = max(now - self._last_at, 1e-9)
        p50, p99 = stats.latency_percentiles(0.5, 0.99)
        self._logger.info(
            "records in %d (%.0f/s, %d joinable), joins out %d (%.0f/s), dlq %d, lag %d, "
            "state %d held records in %d keys%s, %d records restored, commit latency p50 %.0f ms p99 %.0f ms, "
            "transactions %d (%d aborted)",
            stats.records_in, (stats.records_in - self._last_records) / elapsed, stats.joinable,
            stats.joins_out, (stats.joins_out - self._last_joins) / elapsed,
            stats.dead_letters, state.lag, state.held, state.keys,
            f", {state.replaying} partitions replaying" if state.replaying else "", stats.rebuilt,
            p50, p99, stats.transactions, stats.aborted)
        self._last_at = now
        self._last_records = stats.records_in
        self._last_joins = stats.joins_out
        if not stats.keep_latencies:
            del stats.latencies_ms[:]
        if state.forced > self._forced_reported:
            # Forcing follows arrival and moves a stream's frontier past its held records, which a restore
            # after a crash does not reproduce: say so loudly.
            self._logger.warning(
                "%d pending records forced out by the pending limit (a stream of a key stalls); their pairs are "
                "exact only if no restart happens before they are released", state.forced)
        self._forced_reported = state.forced
