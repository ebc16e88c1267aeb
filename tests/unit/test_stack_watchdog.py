"""The watchdog's judgement and records without a stack: which stages it restarts (ready and stale, of the very
process supervisord runs, and nothing else), its restarts counted apart from supervisord's and not taken for a start by
`up`, and what `make status` shows of them. The restart itself, with supervisord and a wedged stage, is
tests/integration/test_watchdog_short.py's."""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline_core.logs import ready_marker
from pipeline_core.stage_health import Heartbeat, write_heartbeat
from stack.manager import RESTART_LOOP_COUNT, ServiceStatus
from stack.restarts import Restarts, read_restarts
from stack.services import START_MARKER
from stack.watchdog import (WatchdogRestart, WatchedStage, append_history, find_wedged, latest_restarts,
                            read_watch_list, status_lines, write_watch_list)

NOW = 1_800_000_000.0


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr("pipeline_core.paths.STATE_DIR", tmp_path)
    return tmp_path


def ready(watched: WatchedStage, pid: int, logged: int | None = None) -> WatchedStage:
    """`watched` with the process `pid` seen ready: its READY line (of `logged`, its child's under spark-submit) in the
    latest run of its log."""
    service = watched.service
    service.log_file.parent.mkdir(parents=True, exist_ok=True)
    service.log_file.write_text(f"{START_MARKER} 2026-12-06\n{ready_marker(logged or pid)} {watched.name}\n")
    return watched


def beat(watched: WatchedStage, *, age_s: float, pid: int, work_waiting: bool = False,
         progress_age_s: float = 0.0) -> None:
    write_heartbeat(watched.service.progress_file, Heartbeat(
        watched.stage, pid, 10.0, NOW - 3600, NOW - age_s, NOW - max(age_s, progress_age_s), work_waiting,
        5_000 if work_waiting else 0, waiting_since=NOW - 3000 if work_waiting else None,
        waiting_for="Kafka" if work_waiting else None))


JOINER = WatchedStage("lsb-joiner", "kafka_joiner")


def test_a_ready_stage_whose_own_heartbeat_is_stale_is_wedged() -> None:
    beat(ready(JOINER, os.getpid()), age_s=36.0, pid=os.getpid())  # stale after 3 intervals and 5 s: 35 s
    (wedged,) = find_wedged([JOINER], {"lsb-joiner": ("RUNNING", os.getpid())}, NOW)
    assert wedged.pid == os.getpid() and wedged.health.state == "stale" and wedged.heartbeat_age_s == 36.0
    assert "no report for 36s" in wedged.health.detail


def test_a_slow_or_waiting_stage_is_left_alone() -> None:
    running = {"lsb-joiner": ("RUNNING", os.getpid())}
    beat(ready(JOINER, os.getpid()), age_s=34.0, pid=os.getpid())  # late, not stale yet
    assert find_wedged([JOINER], running, NOW) == []
    # Kafka away for an hour: it reports that it waits (stuck), its loop turning.
    beat(JOINER, age_s=1.0, pid=os.getpid(), work_waiting=True, progress_age_s=3600.0)
    assert find_wedged([JOINER], running, NOW) == []


def test_a_stage_still_starting_is_left_alone(state_dir: Path) -> None:
    # Its reporter wrote its first heartbeat, then its start went on for minutes (a JVM, Spark's first batches).
    beat(JOINER, age_s=600.0, pid=os.getpid())
    assert find_wedged([JOINER], {"lsb-joiner": ("RUNNING", os.getpid())}, NOW) == []
    ready(JOINER, os.getpid() + 1)  # a predecessor's READY says nothing of it
    assert find_wedged([JOINER], {"lsb-joiner": ("RUNNING", os.getpid())}, NOW) == []


def test_only_a_running_process_with_its_own_heartbeat_is_judged() -> None:
    beat(ready(JOINER, os.getpid()), age_s=600.0, pid=os.getpid())
    # A predecessor's heartbeat says nothing of the process that runs now (it has not reported yet).
    ready(JOINER, os.getpid() + 1)
    assert find_wedged([JOINER], {"lsb-joiner": ("RUNNING", os.getpid() + 1)}, NOW) == []
    ready(JOINER, os.getpid())
    for state in ("STARTING", "STOPPING", "BACKOFF", "STOPPED", "EXITED", "FATAL"):
        assert find_wedged([JOINER], {"lsb-joiner": (state, os.getpid())}, NOW) == [], state
    assert find_wedged([JOINER], {}, NOW) == []
    assert find_wedged([WatchedStage("db-connector", "db_connector")], {"db-connector": ("RUNNING", os.getpid())},
                       NOW) == []


def test_the_spark_joiner_is_judged_by_its_python_driver_under_spark_submit() -> None:
    driver = WatchedStage("spark-joiner", "spark_joiner", heartbeat_of_child=True)
    # The driver is a child of spark-submit's JVM (here: this process, a child of its parent).
    beat(ready(driver, os.getppid(), logged=os.getpid()), age_s=40.0, pid=os.getpid())
    (wedged,) = find_wedged([driver], {"spark-joiner": ("RUNNING", os.getppid())}, NOW)
    assert wedged.pid == os.getppid() and wedged.heartbeat.pid == os.getpid()
    assert find_wedged([driver], {"spark-joiner": ("RUNNING", os.getpid())}, NOW) == []


def test_the_watch_list_round_trips_and_a_missing_one_watches_nothing(tmp_path: Path) -> None:
    stages = [JOINER, WatchedStage("spark-joiner", "spark_joiner", heartbeat_of_child=True)]
    path = write_watch_list(tmp_path / "supervisor", stages)
    assert read_watch_list(path) == stages
    assert read_watch_list(tmp_path / "none.json") == []


def write_starts(path: Path, *starts: dict) -> Path:
    path.write_text("".join(json.dumps(start) + "\n" for start in starts))
    return path


def test_the_watchdog_s_restarts_are_counted_apart_and_begin_no_count_anew(tmp_path: Path) -> None:
    history = write_starts(
        tmp_path / "starts.jsonl",
        {"time": 1.0, "process": "joiner", "from": "STOPPED"},  # up
        {"time": 2.0, "process": "joiner", "from": "EXITED"},  # a crash: supervisord's
        {"time": 3.0, "process": "joiner", "from": "STOPPED", "by": "watchdog"},
        {"time": 4.0, "process": "joiner", "from": "EXITED"},
        {"time": 5.0, "process": "joiner", "from": "STOPPED", "by": "watchdog"},
        {"time": 1.0, "process": "kafka", "from": "STOPPED"},
        {"time": 6.0, "process": "connector", "from": "STOPPED", "by": "watchdog"},
        {"time": 7.0, "process": "connector", "from": "STOPPED"},  # up (or make restart) begins anew
    )
    restarts = read_restarts(history)
    assert restarts["joiner"] == Restarts((2.0, 4.0), 0, (3.0, 5.0)) and restarts["joiner"].count == 2
    assert restarts["kafka"] == Restarts()
    assert restarts["connector"] == Restarts()


def test_status_calls_a_stage_the_watchdog_keeps_restarting_wedging() -> None:
    now = time.time()
    entry = ServiceStatus("joiner", "RUNNING", 1, 1.0, Restarts(watchdog=tuple(now - n for n in
                                                                               range(RESTART_LOOP_COUNT))),
                          {}, True, Path("joiner.log"))
    assert entry.trouble.startswith(f"keeps wedging: restarted by the watchdog {RESTART_LOOP_COUNT} times")
    once = ServiceStatus("joiner", "RUNNING", 1, 1.0, Restarts(watchdog=(now,)), {}, True, Path("joiner.log"))
    assert once.trouble is None  # one restart is the watchdog doing its job


@dataclass
class Entry:
    name: str
    restarts: Restarts


def test_status_shows_the_latest_restart_with_the_log_s_last_lines(tmp_path: Path) -> None:
    history = tmp_path / "watchdog.jsonl"
    tail = ([f"line {n}" for n in range(30)] + ["Thread 0x00007f01 (most recent call first):", '  File "a.py", line 1 in run',
            "", "Current thread 0x00007f00 (most recent call first):", '  File "wedge.py", line 49 in block_if_armed']
            + [f'  File "loop.py", line {n} in step' for n in range(40)])
    for at, pid, new_pid in ((NOW - 600, 10, 11), (NOW - 60, 11, 12)):
        append_history(history, WatchdogRestart(at, "lsb-joiner", "kafka_joiner", pid, 36.2, "no report for 36s",
                                                "lsb-joiner.log", tail, new_pid, 10.4, 11.0))
    append_history(history, WatchdogRestart(NOW - 30, "db-connector", "db_connector", 20, 40.0, "no report", "db.log"))
    assert latest_restarts(history)["lsb-joiner"].new_pid == 12
    lines = status_lines([Entry("lsb-joiner", Restarts(watchdog=(1.0, 2.0))), Entry("db-connector", Restarts())],
                         NOW, history)
    assert lines[0] == ("watchdog: lsb-joiner restarted by the watchdog 1m00s ago: no report for 36s; pid 11 -> 12, "
                        "ended in 10.4 s, running again 11.0 s after the decision")
    # The last lines it logged, then its main thread's stack (the last one), its deepest frames cut.
    assert lines[2:8] == [f"    line {n}" for n in range(25, 30)] + [
        "  where its main thread, which turns its loop, was (most recent call first):"]
    assert lines[8:10] == ["    Current thread 0x00007f00 (most recent call first):",
                           '      File "wedge.py", line 49 in block_if_armed'] and len(lines) == 8 + 30
    assert not any("a.py" in line for line in lines)
    assert not any("db-connector" in line for line in lines)  # `up` started it since: its count begins anew
    assert status_lines([Entry("lsb-joiner", Restarts(watchdog=(1.0,)))], NOW + 2 * 24 * 3600, history) == []
