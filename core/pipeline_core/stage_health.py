"""When a stage is healthy: it made progress, or had nothing to do, within its reporting interval.

A process that is merely alive is not healthy. Every long-running stage writes a heartbeat file at each
progress report (`pipeline_core.progress`): when it reported, when its work last moved, whether work waits
for it and how much. `assess` judges one heartbeat; `make status` and the Compose healthcheck
(`python -m stack.health_probe`) both use it, so both say the same.

* **stale**: the heartbeat is older than `STALE_AFTER_INTERVALS` intervals (plus `REPORT_SLACK_S` for a
  report's own work): the stage's loop no longer turns (dead, wedged in a call, or hung).
* **stuck**: the heartbeat is fresh, work waits (input lag, records in hand, a server the stage keeps failing
  to use), and its work has not moved for `STUCK_AFTER_INTERVALS` intervals while it waited: a DB connector
  retrying writes InfluxDB refuses, a connector whose Kafka side cannot deliver, a Spark query failing again
  and again.
* **missing**: no heartbeat (of this process): not reported yet, or the stage writes none.
* **healthy**: fresh, and either its work moved within the last intervals ("progressing") or nothing waits
  for it ("idle").
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# A stage reports every interval; three missed reports in a row are no scheduling hiccup.
STALE_AFTER_INTERVALS = 3.0
# Time a report itself may take (asking the broker for offsets, a busy machine) on top of the intervals.
REPORT_SLACK_S = 5.0
# Work waiting and nothing done for this many intervals: a batch longer than one interval is still progress.
STUCK_AFTER_INTERVALS = 3.0

HEALTHY_STATES = ("progressing", "idle")


@dataclass(frozen=True)
class Heartbeat:
    """What a stage says of itself at a progress report. Times are Unix seconds (read by other processes)."""

    stage: str
    pid: int
    interval_s: float  # seconds between reports
    started_at: float  # when the stage started reporting
    reported_at: float
    last_progress_at: float | None  # when its work last moved (None: not since it started)
    work_waiting: bool  # input lag, rows queued or records in flight at the report
    lag: int | None  # records waiting for the stage, when it knows
    pending: int | None = None  # records taken in but not done yet (a batch, unacknowledged rows)
    # The first report of the reports in a row that saw work waiting: a stage idle for an hour that gets work
    # is not stuck at once.
    waiting_since: float | None = None
    waiting_for: str | None = None  # a server it keeps failing to use
    note: str | None = None  # what an operator should know beyond the figures (`make status` shows it)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Heartbeat:
        values: dict[str, Any] = json.loads(text)
        return cls(**{name: values.get(name) for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class StageHealth:
    """The verdict on one heartbeat, with what an operator reads of it."""

    state: str  # progressing | idle | stuck | stale | missing
    detail: str  # one line: why
    lag: int | None = None
    progress_age_s: float | None = None  # seconds since its work last moved; None: not since it started
    note: str | None = None  # the stage's own word to the operator (`Heartbeat.note`)

    @property
    def healthy(self) -> bool:
        return self.state in HEALTHY_STATES


def stale_after_s(interval_s: float) -> float:
    return STALE_AFTER_INTERVALS * interval_s + REPORT_SLACK_S


def assess(heartbeat: Heartbeat | None, now: float) -> StageHealth:
    """The stage's health at Unix time `now` by its latest heartbeat (None: it wrote none)."""
    if heartbeat is None:
        return StageHealth("missing", "no heartbeat: the stage has not reported (yet)")
    since = heartbeat.last_progress_at if heartbeat.last_progress_at is not None else heartbeat.started_at
    if heartbeat.waiting_since is not None:
        since = max(since, heartbeat.waiting_since)
    progress_age_s = max(0.0, now - heartbeat.last_progress_at) if heartbeat.last_progress_at is not None else None
    lag = heartbeat.lag
    age_s = now - heartbeat.reported_at
    if age_s > stale_after_s(heartbeat.interval_s):
        return StageHealth("stale", f"no report for {format_age(age_s)} (every {heartbeat.interval_s:g} s expected): "
                                    "the stage is dead or wedged", lag, progress_age_s, heartbeat.note)
    waiting = describe_waiting(heartbeat)
    quiet_s = heartbeat.reported_at - since
    if heartbeat.work_waiting and quiet_s > STUCK_AFTER_INTERVALS * heartbeat.interval_s:
        return StageHealth("stuck", f"{waiting}, no progress for {format_age(now - since)}", lag, progress_age_s,
                           heartbeat.note)
    if heartbeat.work_waiting or heartbeat.last_progress_at == heartbeat.reported_at:
        return StageHealth("progressing", waiting if heartbeat.work_waiting else "work moved at the last report",
                           lag, progress_age_s, heartbeat.note)
    return StageHealth("idle", "nothing waiting", lag, progress_age_s, heartbeat.note)


def describe_waiting(heartbeat: Heartbeat) -> str:
    """`waiting for InfluxDB, 12,345 records waiting, 500 in hand`, as far as the stage knows."""
    if not heartbeat.work_waiting:
        return "nothing waiting"
    parts = [f"waiting for {heartbeat.waiting_for}"] if heartbeat.waiting_for else []
    if heartbeat.lag:
        parts.append(f"{heartbeat.lag:,} records waiting")
    if heartbeat.pending:
        parts.append(f"{heartbeat.pending:,} in hand")
    return ", ".join(parts) or "work waiting"


def format_age(seconds: float) -> str:
    """`45s`, `3m10s`, `2h05m`."""
    seconds = int(max(seconds, 0))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def write_heartbeat(path: Path, heartbeat: Heartbeat) -> None:
    """Replace the file atomically: a reader sees the previous heartbeat or this one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    try:
        with os.fdopen(handle, "w") as file:
            file.write(heartbeat.to_json() + "\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def read_heartbeat(path: Path) -> Heartbeat | None:
    """The heartbeat in `path`; None when there is none (or it is not one)."""
    try:
        return Heartbeat.from_json(path.read_text())
    except (OSError, ValueError, TypeError):
        return None
