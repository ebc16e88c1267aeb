"""The wedge (fault injection for the watchdog's tests) and the stack dump, in a process of their own: SIGUSR2 stops
the loop's heartbeat for good while the process lives and answers signals (SIGUSR1 writes every thread's stack,
where the loop is seen blocked; SIGTERM sets its stop, which the blocked loop never sees); without the setting
SIGUSR2 is not taken."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pipeline_core.settings import ProgressSettings, load_settings
from pipeline_core.stage_health import read_heartbeat
from stack.processes import process_state
from support import wait_for

PROGRAM = textwrap.dedent("""
    import sys, time
    from pipeline_core.lifecycle import process_stop_signal
    from pipeline_core.logs import configure_logging
    from pipeline_core.progress import ProgressReporter, StageCounters
    from pipeline_core.settings import ProgressSettings, load_settings

    configure_logging()
    stop = process_stop_signal()
    settings = load_settings(ProgressSettings, ["--progress-interval-s", "0.2", "--no-health-metrics",
                                                "--progress-file", sys.argv[1], *sys.argv[2:]])
    progress = ProgressReporter.for_stage("test_stage", StageCounters(), settings)

    def loop():
        while not stop.is_set():
            progress.maybe_report()
            time.sleep(0.01)

    loop()
    print("stopped", flush=True)
""")


def start(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen, Path, Path]:
    """The program, its heartbeat file, and the file of its stderr (its log)."""
    heartbeat, log = tmp_path / "progress.json", tmp_path / "stderr.log"
    with log.open("w") as stderr:
        process = subprocess.Popen([sys.executable, "-c", PROGRAM, str(heartbeat), *flags],
                                   stdout=subprocess.DEVNULL, stderr=stderr)
    wait_for(lambda: (beat := read_heartbeat(heartbeat)) is not None and beat.reported_at > beat.started_at, 30,
             "the loop's reports")
    return process, heartbeat, log


def test_sigusr2_wedges_the_loop_for_good_and_the_process_answers_signals(tmp_path: Path) -> None:
    process, heartbeat, log = start(tmp_path, "--wedge-on-sigusr2")
    try:
        os.kill(process.pid, signal.SIGUSR2)
        wait_for(lambda: "wedged by SIGUSR2" in log.read_text(), 30, "the wedge's warning")
        # No report for 10 intervals, the process alive (sleeping in its read, not stopped, no zombie).
        wait_for(lambda: time.time() - read_heartbeat(heartbeat).reported_at > 2.0, 30, "the heartbeat to stop")
        assert process.poll() is None and process_state(process.pid) in ("S", "R")
        os.kill(process.pid, signal.SIGUSR1)  # every thread's stack, into its log
        dump = wait_for(lambda: (text := log.read_text()).partition("most recent call first")[2], 30, "the stacks")
        # Where the loop hangs: the read of the wedge, called from the loop's report.
        assert "in block_if_armed" in dump and "in maybe_report" in dump and "in loop" in dump, dump
        os.kill(process.pid, signal.SIGTERM)  # taken, but the wedged loop never turns to see it
        wait_for(lambda: "SIGTERM: finishing what is in flight" in log.read_text(), 30, "the stop's line")
        reported_at = read_heartbeat(heartbeat).reported_at
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(timeout=2.0)
        assert read_heartbeat(heartbeat).reported_at == reported_at
    finally:
        process.kill()
        process.wait(timeout=30)


def test_without_the_setting_sigusr2_is_not_taken(tmp_path: Path) -> None:
    assert load_settings(ProgressSettings, [], environ={}).wedge_on_sigusr2 is False
    assert load_settings(ProgressSettings, [], environ={"PIPELINE_WEDGE_ON_SIGUSR2": "true"}).wedge_on_sigusr2
    process, _heartbeat, _log = start(tmp_path)
    try:
        os.kill(process.pid, signal.SIGUSR2)  # the default action: the process ends
        assert process.wait(timeout=30) == -signal.SIGUSR2
    finally:
        process.kill()
        process.wait(timeout=30)
