"""Where a replay moved in time (`--ending-now`, as `make data` runs it) lands: with its newest row at now, unless
an earlier replay into the same stack left one of its machines later than that; then past that machine's rows.

The joiners dead-letter a record older than the newest of its series as `out_of_order`. The shipped rows span
about 239 hours: a second `make data` that again put the newest row at now would lay its rows over the first
replay's, and most would be refused. So every replay moved in time notes, per machine, the newest time it
published (`ReplayLog`, a small JSON file in the stack's state dir, which `make clean` deletes with the data);
the next one is moved on until each of its machines starts `REPLAY_GAP_MS` after that machine's noted time.
Right after a first replay, a second one then lies in the future, as far as the rows span; days later, at now.
"""
from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .events import Row, event_time_ms

log = logging.getLogger(__name__)

# Between a machine's last row of one replay and its first of the next: more than a join spec's window (1 s by
# default) and its bound on disorder, so no pair spans two replays and each replay joins as it would alone.
REPLAY_GAP_MS = 60_000
# How often a running replay notes how far it got (a replay without end, a large one).
NOTE_INTERVAL_S = 1.0


def machine_of(row: Any) -> str | None:
    thing = row.get("Thing") if isinstance(row, dict) else None
    return thing if isinstance(thing, str) and thing else None


def newest_per_machine(rows: Iterable[Row]) -> dict[str, float]:
    """Each machine's newest time among `rows` (rows without a machine or a valid time left out)."""
    newest: dict[str, float] = {}
    for row in rows:
        thing, time_ms = machine_of(row), event_time_ms(row)
        if thing is not None and time_ms is not None and time_ms > newest.get(thing, float("-inf")):
            newest[thing] = time_ms
    return newest


def oldest_per_machine(rows: Iterable[Row]) -> dict[str, float]:
    """Each machine's oldest time among `rows`."""
    oldest: dict[str, float] = {}
    for row in rows:
        thing, time_ms = machine_of(row), event_time_ms(row)
        if thing is not None and time_ms is not None and time_ms < oldest.get(thing, float("inf")):
            oldest[thing] = time_ms
    return oldest


def shift_past(delta_ms: int, oldest: Mapping[str, float], previous: Mapping[str, float],
               gap_ms: int = REPLAY_GAP_MS) -> int:
    """The shift to apply instead of `delta_ms`: at least as large, and large enough that every machine's oldest
    row (`oldest`, before the shift) lands `gap_ms` or more after that machine's newest earlier row (`previous`)."""
    needed = [previous[thing] + gap_ms - time_ms for thing, time_ms in oldest.items() if thing in previous]
    return max([delta_ms, *(math.ceil(value) for value in needed)])


def describe_ms(time_ms: float) -> str:
    return datetime.fromtimestamp(time_ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


class ReplayLog:
    """Per machine, the newest time of the rows replays moved in time have published: a JSON file, changed
    under a lock and replaced whole, so replays run one after another (or side by side) each see all notes."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def newest(self) -> dict[str, float]:
        try:
            values = json.loads(self.path.read_text()).get("newest_ms", {})
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, AttributeError) as error:
            log.warning("%s cannot be read (%s): replays are placed as if none came before", self.path, error)
            return {}
        return {str(thing): float(time_ms) for thing, time_ms in values.items()
                if isinstance(time_ms, (int, float)) and not isinstance(time_ms, bool)}

    def note(self, newest: Mapping[str, float]) -> None:
        """Take `newest` into the notes (each machine's later time wins)."""
        if not newest:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._locked():
            noted = self.newest()
            changed = {thing: time_ms for thing, time_ms in newest.items() if time_ms > noted.get(thing, float("-inf"))}
            if not changed:
                return
            noted.update(changed)
            with tempfile.NamedTemporaryFile("w", dir=self.path.parent, prefix=self.path.name, delete=False) as out:
                json.dump({"newest_ms": noted}, out, indent=1, sort_keys=True)
            os.replace(out.name, self.path)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.path.with_name(self.path.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield


class ReplayNotes:
    """Notes how far a running replay got, per machine, in its `ReplayLog`: at most every `NOTE_INTERVAL_S` while
    rows pass through `track`, and at `flush`."""

    def __init__(self, replay_log: ReplayLog) -> None:
        self.log = replay_log
        self.newest: dict[str, float] = {}
        self._noted_at = time.monotonic()

    def track(self, rows: Iterable[Row]) -> Iterator[Row]:
        newest = self.newest
        for row in rows:
            thing, time_ms = machine_of(row), event_time_ms(row)
            if thing is not None and time_ms is not None and time_ms > newest.get(thing, float("-inf")):
                newest[thing] = time_ms
            yield row
            if time.monotonic() - self._noted_at >= NOTE_INTERVAL_S:
                self.flush()

    def flush(self) -> None:
        self.log.note(self.newest)
        self._noted_at = time.monotonic()
