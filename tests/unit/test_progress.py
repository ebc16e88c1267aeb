"""The shared progress reporter, health-metrics writer and stop signal, without servers."""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest

from pipeline_core import lifecycle
from pipeline_core.health_metrics import HealthMetrics, PointsRefused, health_line
from pipeline_core.lifecycle import StopSignal, process_stop_signal
from pipeline_core.progress import Observation, ProgressReporter, StageCounters, progress_report
from support import ManualClock, wait_for

TAGS = {"stage": "db_connector", "instance": "host-1"}


def test_a_health_line_types_its_fields_and_leaves_out_what_is_unknown() -> None:
    line = health_line(TAGS, {"records_in": 12, "records_in_per_s": 2.5, "lag": None, "state_bytes": float("nan"),
                              "rate": float("inf"), "flag": True}, 1_700_000_000_000_000_000)
    assert line == ("pipeline_health,instance=host-1,stage=db_connector records_in=12i,records_in_per_s=2.5 "
                    "1700000000000000000")


def test_a_health_line_without_a_known_field_is_none() -> None:
    assert health_line(TAGS, {"lag": None}, 1) is None


def test_tag_values_are_escaped() -> None:
    line = health_line({"stage": "a b", "instance": "x,y=z"}, {"lag": 1}, 5)
    assert line == r"pipeline_health,instance=x\,y\=z,stage=a\ b lag=1i 5"


def test_rates_are_per_second_over_the_interval() -> None:
    report = progress_report({"records_in": 150, "records_out": 30, "dead_letters": 4, "batches": 7},
                             {"records_in": 50, "records_out": 10, "dead_letters": 4, "batches": 5}, 10.0,
                             Observation(lag=42, values={"state_rows": 9}))
    assert report.rates == {"records_in": 10.0, "records_out": 2.0, "dead_letters": 0.0}
    assert report.fields() == {"records_in": 150, "records_out": 30, "dead_letters": 4, "batches": 7,
                               "records_in_per_s": 10.0, "records_out_per_s": 2.0, "dead_letters_per_s": 0.0,
                               "lag": 42, "state_rows": 9}


def test_the_log_line_names_counters_rates_lag_and_the_rest() -> None:
    report = progress_report({"records_in": 1500, "records_out": 30, "dead_letters": 4, "rejected_rows": 2},
                             {}, 10.0, Observation(lag=None, values={"unacked_rows": 3, "batch_seconds": 0.25}))
    assert report.describe({"records_in": "rows in"}) == (
        "rows in 1,500 (150/s), records out 30 (3/s), dead letters 4, lag ?; "
        "rejected rows 2, unacked rows 3, batch seconds 0.25")


@dataclass
class _Counters(StageCounters):
    batches: int = 0


class _Recorder:
    """Stands in for HealthMetrics: keeps the lines it is given."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def record(self, line: str) -> None:
        self.lines.append(line)

    def close(self) -> None:
        pass


def test_the_reporter_reports_once_per_interval_with_the_stage_s_lag(caplog) -> None:
    clock, recorder, counters = ManualClock(100.0), _Recorder(), _Counters()
    reporter = ProgressReporter("db_connector", counters, interval_s=10.0, observe=lambda: Observation(lag=7),
                                health=recorder, instance="host-1", clock=clock)  # type: ignore[arg-type]
    counters.records_in += 100
    clock.now_s += 9.9
    assert reporter.maybe_report() is None and recorder.lines == []
    clock.now_s += 0.1
    with caplog.at_level(logging.INFO):
        report = reporter.maybe_report()
    assert report is not None and report.rates["records_in"] == pytest.approx(10.0) and report.lag == 7
    (line,) = recorder.lines
    assert line.startswith("pipeline_health,instance=host-1,stage=db_connector ")
    assert "lag=7i" in line and "records_in=100i" in line and "batches=0i" in line
    assert "records in 100 (10/s)" in caplog.text
    assert reporter.maybe_report() is None  # the next interval starts now


def test_closing_reports_what_was_counted_since_the_last_report() -> None:
    recorder, counters = _Recorder(), StageCounters()
    reporter = ProgressReporter("x", counters, interval_s=10.0, health=recorder, clock=ManualClock(100.0))  # type: ignore[arg-type]
    reporter.report()
    reporter.close()
    assert len(recorder.lines) == 1  # nothing new: the last line stands
    counters.records_out += 1
    reporter.close()
    assert len(recorder.lines) == 2 and "records_out=1i" in recorder.lines[-1]


def test_a_failing_measurement_is_logged_and_the_counters_still_reported(caplog) -> None:
    def broken() -> Observation:
        raise RuntimeError("broker gone")

    recorder = _Recorder()
    reporter = ProgressReporter("x", StageCounters(records_in=3), interval_s=1.0, observe=broken,
                                health=recorder, clock=ManualClock(100.0))  # type: ignore[arg-type]
    report = reporter.report()
    assert report.lag is None and "records_in=3i" in recorder.lines[0]
    assert "broker gone" in caplog.text


class _FlakyInflux:
    """A send function failing while `down` is set, recording what it stored."""

    def __init__(self) -> None:
        self.down = True
        self.stored: list[str] = []
        self.calls = 0

    def __call__(self, lines: Sequence[str]) -> None:
        self.calls += 1
        if self.down:
            raise ConnectionError("connection refused")
        self.stored.extend(lines)


def test_an_outage_defers_points_and_never_raises_into_the_stage(caplog) -> None:
    influx = _FlakyInflux()
    metrics = HealthMetrics(influx, retry_max_s=0.05)
    try:
        for index in range(5):
            metrics.record(f"p{index}")
        wait_for(lambda: influx.calls >= 3, 10, "retries while InfluxDB is down")
        assert influx.stored == [] and "deferring" in caplog.text
        assert caplog.text.count("unreachable") == 1  # one warning per outage, not per try
        influx.down = False
        metrics.record("p5")
        wait_for(lambda: len(influx.stored) == 6, 10, "the deferred points written")
        assert influx.stored == [f"p{index}" for index in range(6)]  # in order, none twice
        assert metrics.written == 6 and metrics.dropped == 0
    finally:
        metrics.close()


def test_beyond_the_limit_the_oldest_points_are_dropped() -> None:
    influx = _FlakyInflux()
    metrics = HealthMetrics(influx, max_pending=3, retry_max_s=0.05)
    try:
        for index in range(10):
            metrics.record(f"p{index}")
        wait_for(lambda: influx.calls >= 2, 10, "a failed write")
        influx.down = False
        metrics.record("p10")
        wait_for(lambda: influx.stored, 10, "the points kept written")
        wait_for(lambda: metrics.pending == 0, 10, "nothing pending")
        assert influx.stored == ["p8", "p9", "p10"] and metrics.dropped == 8
    finally:
        metrics.close()


def test_refused_points_are_dropped_not_retried_forever() -> None:
    calls: list[list[str]] = []

    def refuse(lines: Sequence[str]) -> None:
        calls.append(list(lines))
        raise PointsRefused("field type conflict")

    metrics = HealthMetrics(refuse)
    metrics.record("bad")
    wait_for(lambda: metrics.dropped == 1, 10, "the refused point dropped")
    metrics.close()
    assert calls == [["bad"]]


def test_close_gives_up_on_a_hanging_influxdb() -> None:
    release, writing, written = threading.Event(), threading.Event(), threading.Event()

    def hanging_write(lines: Sequence[str]) -> None:
        writing.set()
        release.wait(30)
        written.set()

    metrics = HealthMetrics(hanging_write)
    metrics.record("p")
    wait_for(writing.is_set, 10, "the write to begin")
    began_s = time.monotonic()
    metrics.close(timeout_s=0.1)
    waited_s = time.monotonic() - began_s
    try:
        assert not written.is_set(), "the write did not hang: the test proves nothing"
        assert waited_s < 2.0, f"close waited {waited_s:.1f} s for a write that hangs (timeout 0.1 s)"
    finally:
        release.set()


@pytest.fixture
def restored_signals() -> Iterator[None]:
    saved = {signum: signal.getsignal(signum) for signum in lifecycle.STOP_SIGNALS}
    lifecycle._process_signal = None
    yield
    lifecycle._process_signal = None
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_sigterm_sets_the_process_stop_signal_once(restored_signals, caplog) -> None:
    stop = process_stop_signal()
    assert process_stop_signal() is stop and not stop.is_set()
    with caplog.at_level(logging.INFO):
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(10) and stop.is_set() and stop.reason == "SIGTERM"
        os.kill(os.getpid(), signal.SIGINT)  # a second signal changes nothing
        wait_for(lambda: "already stopping" in caplog.text, 10, "the second signal's warning")
    assert stop.reason == "SIGTERM"


def test_a_stop_signal_set_by_code_wakes_a_waiting_loop() -> None:
    stop = StopSignal()
    assert stop.wait(0.01) is False
    waiter = threading.Thread(target=stop.wait, args=(30,))
    waiter.start()
    stop.set("test")
    waiter.join(10)
    assert not waiter.is_alive() and stop.reason == "test"
