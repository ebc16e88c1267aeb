"""The Kafka joiner's part of its progress reports, without Kafka."""
from __future__ import annotations

import logging

from kafka_joiner.progress import JoinerObservation, JoinerStats, StateFigures
from local_stream_buffer.clock import ClockCounters
from pipeline_core.progress import counter_totals

log = logging.getLogger("test")


def test_only_the_counters_are_totals_not_times_or_samples() -> None:
    stats = JoinerStats(records_in=5, records_out=2, joinable=4, first_record_at=1.5, keep_latencies=True)
    stats.latencies_ms.extend([1.0, 2.0])
    totals = counter_totals(stats)
    assert totals["records_in"] == 5 and totals["records_out"] == 2 and totals["joinable"] == 4
    assert not {"first_record_at", "last_commit_at", "latencies_ms", "keep_latencies"} & totals.keys()


def test_the_observation_has_lag_state_and_the_interval_s_commit_latency(caplog) -> None:
    stats = JoinerStats()
    stats.latencies_ms.extend(float(ms) for ms in range(1, 101))
    figures = StateFigures(lag=42, held=7, keys=3, replaying=0, forced=0,
                           clock_faults={"R0815": ClockCounters(outliers=2, steps_back=1), "H31415": ClockCounters(),
                                         "Plant1.Hall2.Press3": ClockCounters(jumps_ahead=1)})
    observed = JoinerObservation(stats, lambda: figures, log)()
    assert observed.lag == 42
    assert observed.values == {"commit_latency_p50_ms": 51.0, "commit_latency_p99_ms": 100.0, "held_records": 7,
                               "held_keys": 3, "replaying_partitions": None, "forced": 0, "clock_outliers": 2,
                               "clock_steps_back": 1, "clock_jumps_ahead": 1}
    # Per machine the clock rule caught at something (not H31415), for the machine_health points.
    assert observed.machines == {
        "R0815": {"clock_outliers": 2, "clock_steps_back": 1, "clock_jumps_ahead": 0},
        "Plant1.Hall2.Press3": {"clock_outliers": 0, "clock_steps_back": 0, "clock_jumps_ahead": 1}}
    assert len(stats.latencies_ms) == 0  # the next interval starts afresh
    assert "forced" not in caplog.text


def test_before_any_partition_is_owned_the_lag_is_unknown() -> None:
    observed = JoinerObservation(JoinerStats(), lambda: None, log)()
    assert observed.lag is None
    assert observed.values == {"commit_latency_p50_ms": None, "commit_latency_p99_ms": None}


def test_records_forced_out_are_warned_about_once_each(caplog) -> None:
    stats, forced = JoinerStats(keep_latencies=True), [0]
    stats.latencies_ms.append(5.0)
    observe = JoinerObservation(stats, lambda: StateFigures(0, 0, 0, 0, forced[0]), log)
    forced[0] = 3
    observe()
    observe()
    assert caplog.text.count("3 pending records forced out") == 1
    assert list(stats.latencies_ms) == [5.0]  # the benchmark keeps every sample
