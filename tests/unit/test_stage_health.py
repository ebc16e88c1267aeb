"""The health rule (`pipeline_core.stage_health`) and the heartbeat the progress reporter writes for it."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline_core import paths
from pipeline_core.progress import Observation, ProgressReporter, StageCounters
from pipeline_core.stage_health import (Heartbeat, assess, format_age, read_heartbeat, stale_after_s,
                                        write_heartbeat)
from stack.health_probe import heartbeat_file, main, probe

INTERVAL_S = 10.0
START = 1_000_000.0


def heartbeat(reported_at: float, last_progress_at: float | None, *, lag: int | None = 0,
              pending: int | None = None, waiting_since: float | None = None) -> Heartbeat:
    return Heartbeat("db_connector", 42, INTERVAL_S, START, reported_at, last_progress_at,
                     bool(lag) or bool(pending), lag, pending, waiting_since)


def test_no_heartbeat_is_not_healthy() -> None:
    verdict = assess(None, START)
    assert (verdict.state, verdict.healthy) == ("missing", False)


def test_a_fresh_heartbeat_with_nothing_waiting_is_idle_and_healthy_however_old_its_last_progress() -> None:
    now = START + 3600
    verdict = assess(heartbeat(now - 1, START + 5), now)
    assert (verdict.state, verdict.healthy) == ("idle", True)
    assert verdict.progress_age_s == pytest.approx(3595)


def test_work_waiting_and_progress_within_the_intervals_is_healthy() -> None:
    now = START + 100
    verdict = assess(heartbeat(now, now - 2 * INTERVAL_S, lag=5_000), now)
    assert (verdict.state, verdict.healthy) == ("progressing", True)
    assert verdict.lag == 5_000


def test_work_waiting_without_progress_for_three_intervals_is_stuck() -> None:
    now = START + 1000
    verdict = assess(heartbeat(now, now - 190, lag=12_345, pending=500), now)
    assert (verdict.state, verdict.healthy) == ("stuck", False)
    assert verdict.detail == "12,345 records waiting, 500 in hand, no progress for 3m10s"


def test_records_in_hand_alone_are_work_waiting() -> None:
    now = START + 1000
    assert assess(heartbeat(now, now - 4 * INTERVAL_S, lag=0, pending=1), now).state == "stuck"
    assert assess(heartbeat(now, now - 4 * INTERVAL_S, lag=None, pending=None), now).state == "idle"


def test_a_server_the_stage_keeps_failing_to_use_is_work_waiting_with_no_record_known() -> None:
    now = START + 4 * INTERVAL_S
    beat = Heartbeat("db_connector", 42, INTERVAL_S, START, now, None, True, None, None, START, "InfluxDB")
    verdict = assess(beat, now)
    assert (verdict.state, verdict.detail) == ("stuck", "waiting for InfluxDB, no progress for 40s")


def test_a_stage_that_never_progressed_is_stuck_from_its_start() -> None:
    verdict = assess(heartbeat(START + 4 * INTERVAL_S, None, lag=7), START + 4 * INTERVAL_S)
    assert (verdict.state, verdict.progress_age_s) == ("stuck", None)
    assert verdict.detail == "7 records waiting, no progress for 40s"
    assert assess(heartbeat(START + 2 * INTERVAL_S, None, lag=7), START + 2 * INTERVAL_S).healthy


def test_work_that_just_arrived_at_a_long_idle_stage_is_no_sign_of_being_stuck() -> None:
    now = START + 3600
    assert assess(heartbeat(now, START + 5, lag=7, waiting_since=now - INTERVAL_S), now).healthy
    assert assess(heartbeat(now, None, lag=7, waiting_since=now - INTERVAL_S), now).healthy
    verdict = assess(heartbeat(now, START + 5, lag=7, waiting_since=now - 4 * INTERVAL_S), now)
    assert verdict.detail == "7 records waiting, no progress for 40s"


def test_a_stale_heartbeat_is_unhealthy_even_if_it_said_idle() -> None:
    reported = START + 50
    assert assess(heartbeat(reported, reported), reported + stale_after_s(INTERVAL_S) - 0.1).healthy
    verdict = assess(heartbeat(reported, reported), reported + stale_after_s(INTERVAL_S) + 0.1)
    assert (verdict.state, verdict.healthy) == ("stale", False)


def test_a_heartbeat_file_round_trips_and_a_broken_one_reads_as_none(tmp_path: Path) -> None:
    path = tmp_path / "stage" / "progress.json"
    beat = heartbeat(START + 1, START, lag=3, pending=2)
    write_heartbeat(path, beat)
    assert read_heartbeat(path) == beat
    assert list(path.parent.iterdir()) == [path]  # no temporary file left behind
    path.write_text("{not json")
    assert read_heartbeat(path) is None
    assert read_heartbeat(tmp_path / "absent.json") is None


def test_ages_read_as_operators_write_them() -> None:
    assert [format_age(s) for s in (5, 190, 7500)] == ["5s", "3m10s", "2h05m"]


@dataclass
class _Counters(StageCounters):
    batches: int = 0


class _Clocks:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return START + self.now


def test_the_reporter_writes_a_heartbeat_at_start_and_moves_progress_only_with_its_progress_counters(
        tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    counters, clocks = _Counters(), _Clocks()
    observed = [Observation(lag=100, pending=10)]
    reporter = ProgressReporter("db_connector", counters, interval_s=INTERVAL_S, observe=lambda: observed[0],
                                clock=clocks.monotonic, wall_clock=clocks.wall, progress_counters=("batches",),
                                heartbeat_file=path)
    first = read_heartbeat(path)
    assert first is not None and (first.reported_at, first.last_progress_at, first.work_waiting) == (START, None, False)
    assert first.pid == os.getpid()

    clocks.now = 10
    counters.batches += 1
    counters.records_in += 500
    reporter.maybe_report()
    beat = read_heartbeat(path)
    assert (beat.reported_at, beat.last_progress_at, beat.lag, beat.pending, beat.work_waiting, beat.waiting_since) == (
        START + 10, START + 10, 100, 10, True, START + 10)

    for clocks.now in (20, 30, 40, 50):
        counters.records_in += 500  # taken in, nothing done: no progress
        reporter.maybe_report()
    verdict = assess(read_heartbeat(path), START + 50)
    assert verdict.state == "stuck" and verdict.progress_age_s == 40

    observed[0] = Observation(lag=0)
    clocks.now = 60
    reporter.maybe_report()
    assert assess(read_heartbeat(path), START + 60).state == "idle"
    assert read_heartbeat(path).waiting_since is None


def test_the_probe_reads_progress_file_else_the_stages_place_in_the_state_dir(tmp_path: Path) -> None:
    assert heartbeat_file("db-connector", {"PROGRESS_FILE": "/tmp/x/progress.json"}) == Path("/tmp/x/progress.json")
    assert heartbeat_file("db-connector", {}) == paths.STATE_DIR / "db-connector" / "progress.json"
    path = tmp_path / "progress.json"
    assert main(["db-connector", "--file", str(path)]) == 1  # no heartbeat: not healthy
    write_heartbeat(path, heartbeat(START, START))
    assert probe(path, START + 1).healthy
