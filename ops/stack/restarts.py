"""How often supervisord restarted each process, and how often the watchdog did.

supervisord counts no restarts itself, but tells event listeners of every state change. Its event
listener (`python -m stack.restarts FILE DIRECTORY`) appends each start of a process to FILE: a start from
EXITED or BACKOFF is supervisord restarting it, one from STOPPED or FATAL is `up` starting it, which
begins the count anew, unless the watchdog the listener runs (`stack.watchdog`, for the stages listed in
DIRECTORY) stopped and started it: that start is marked `"by": "watchdog"`, counted apart, and begins nothing anew.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from supervisor import childutils

from pipeline_core.logs import configure_logging
from .watchdog import WATCH_LIST, Watchdog, health_metrics, keep_newest_half

RESTARTED_FROM = frozenset({"EXITED", "BACKOFF"})
log = logging.getLogger(__name__)

# What marks a start as the watchdog's in the history.
BY_WATCHDOG = "watchdog"
# The history keeps its newest half once it passes this size (some 12,000 starts): a process in a restart
# loop for months must not fill the disk, and `status` only counts the recent ones.
HISTORY_MAX_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Restarts:
    """The restarts of one process since `up` last started it."""
    times: tuple[float, ...] = ()  # by supervisord
    # How many of the latest starts in a row retried one that exited before its startsecs.
    failed_starts: int = 0
    watchdog: tuple[float, ...] = ()  # by the watchdog (its loop had stopped turning)

    @property
    def count(self) -> int:
        return len(self.times)

    def within(self, seconds: float, now: float | None = None) -> int:
        """How many of them happened in the last `seconds`."""
        since = (time.time() if now is None else now) - seconds
        return sum(1 for at in self.times if at >= since)


def _starts(history: Path) -> Iterator[dict]:
    try:
        lines = history.read_text().splitlines()
    except OSError:
        return
    for line in lines:
        try:
            start = json.loads(line)
        except ValueError:
            continue  # the line being written right now
        if isinstance(start, dict) and {"time", "process", "from"} <= start.keys():
            yield start


def read_restarts(history: Path) -> dict[str, Restarts]:
    """Each process's restarts by supervisord, and by the watchdog, since its last start by `up`."""
    times: dict[str, list[float]] = {}
    watchdog: dict[str, list[float]] = {}
    failed_starts: dict[str, int] = {}
    for start in _starts(history):
        name = start["process"]
        if start.get("by") == BY_WATCHDOG:
            watchdog.setdefault(name, []).append(float(start["time"]))
            times.setdefault(name, [])
        elif start["from"] in RESTARTED_FROM:
            times.setdefault(name, []).append(float(start["time"]))
        else:
            times[name], watchdog[name] = [], []
        failed_starts[name] = failed_starts.get(name, 0) + 1 if start["from"] == "BACKOFF" else 0
    return {name: Restarts(tuple(at), failed_starts[name], tuple(watchdog.get(name, ()))) for name, at in times.items()}


def listen(history: Path, directory: Path) -> None:
    """supervisord's event listener: it writes events to stdin and waits for OK on stdout (so nothing else of this
    process writes to stdout: the watchdog logs to stderr). The watchdog runs on a thread of its own, for the
    stages of `directory`'s watch list."""
    expected: set[str] = set()  # programs the watchdog is about to start again
    lock = threading.Lock()

    def expect_start(name: str) -> None:
        with lock:
            expected.add(name)

    def watchdog_restarts() -> dict[str, int]:
        return {name: len(restarts.watchdog) for name, restarts in read_restarts(history).items()}

    try:
        health = health_metrics()
    except Exception as error:  # noqa: BLE001 - the starts must be recorded whatever InfluxDB's settings say
        log.warning("watchdog: its restart counts go to no InfluxDB (%s: %s)", type(error).__name__, error)
        health = None
    watchdog = Watchdog(childutils.getRPCInterface(os.environ).supervisor, directory / WATCH_LIST, expect_start,
                        health=health, restart_counts=watchdog_restarts)
    threading.Thread(target=watchdog.run, name="watchdog", daemon=True).start()
    while True:
        headers, payload = childutils.listener.wait(sys.stdin, sys.stdout)
        if headers["eventname"] == "PROCESS_STATE_STARTING":
            event = childutils.get_headers(payload)
            start = {"time": time.time(), "process": event["processname"], "from": event["from_state"]}
            with lock:
                if start["from"] == "STOPPED" and start["process"] in expected:
                    expected.discard(start["process"])
                    start["by"] = BY_WATCHDOG
            with history.open("a") as out:
                out.write(json.dumps(start) + "\n")
            if history.stat().st_size > HISTORY_MAX_BYTES:
                keep_newest_half(history, HISTORY_MAX_BYTES)
        childutils.listener.ok(sys.stdout)


if __name__ == "__main__":
    configure_logging()  # to stderr: its own log (`process-events.log`)
    listen(Path(sys.argv[1]), Path(sys.argv[2]))
