"""How often supervisord restarted each process.

supervisord counts no restarts itself, but tells event listeners of every state change. Its event
listener (`python -m stack.restarts FILE`) appends each start of a process to FILE: a start from
EXITED or BACKOFF is supervisord restarting it, one from STOPPED or FATAL is `up` starting it, which
begins the count anew.
"""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from supervisor import childutils

RESTARTED_FROM = frozenset({"EXITED", "BACKOFF"})
# The history keeps its newest half once it passes this size (some 12,000 starts): a process in a restart
# loop for months must not fill the disk, and `status` only counts the recent ones.
HISTORY_MAX_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Restarts:
    """The restarts of one process since `up` last started it."""
    times: tuple[float, ...] = ()
    # How many of the latest starts in a row retried one that exited before its startsecs.
    failed_starts: int = 0

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
    """Each process's restarts by supervisord since its last start by `up`."""
    times: dict[str, list[float]] = {}
    failed_starts: dict[str, int] = {}
    for start in _starts(history):
        name = start["process"]
        if start["from"] in RESTARTED_FROM:
            times.setdefault(name, []).append(float(start["time"]))
        else:
            times[name] = []
        failed_starts[name] = failed_starts.get(name, 0) + 1 if start["from"] == "BACKOFF" else 0
    return {name: Restarts(tuple(at), failed_starts[name]) for name, at in times.items()}


def _keep_newest_half(history: Path) -> None:
    data = history.read_bytes()
    newest = data[len(data) - HISTORY_MAX_BYTES // 2:]
    kept = history.with_name(history.name + ".new")
    kept.write_bytes(newest[newest.find(b"\n") + 1:])
    kept.replace(history)


def listen(history: Path) -> None:
    """supervisord's event listener: it writes events to stdin and waits for OK on stdout."""
    while True:
        headers, payload = childutils.listener.wait(sys.stdin, sys.stdout)
        if headers["eventname"] == "PROCESS_STATE_STARTING":
            event = childutils.get_headers(payload)
            with history.open("a") as out:
                out.write(json.dumps({"time": time.time(), "process": event["processname"],
                                      "from": event["from_state"]}) + "\n")
            if history.stat().st_size > HISTORY_MAX_BYTES:
                _keep_newest_half(history)
        childutils.listener.ok(sys.stdout)


if __name__ == "__main__":
    listen(Path(sys.argv[1]))
