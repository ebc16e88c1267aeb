"""Events files: one JSON row per line, plain, `.gz` or `.zip`; their replay order and repetition.

Rows are published as the file has them, their times included: the stream connector reads a row's
time (`pipeline_core.timestamps.event_time_ms`) and dead-letters a row without a valid one. Here
that reading only orders and paces the rows; a row whose time it cannot read keeps its place after
the row before it in the file, and goes out as it is.
"""
from __future__ import annotations

import gzip
import io
import json
import math
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from pipeline_core.disorder import arrival_order
from pipeline_core.timestamps import InvalidTime, event_time_ms as time_of, shifted_time

Row = dict[str, Any]
ORDERS = ("time", "file")


class EventsFileError(ValueError):
    """An events file that cannot be replayed; the message says where and why."""


def _open_text(path: Path) -> TextIO:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    if path.suffix == ".zip":
        archive = zipfile.ZipFile(path)
        members = [name for name in archive.namelist() if not name.endswith("/")]
        if len(members) != 1:
            raise EventsFileError(f"{path}: expected one file in the archive, found {len(members)}")
        return io.TextIOWrapper(archive.open(members[0]), encoding="utf-8")
    return open(path, encoding="utf-8")


def read_events(path: Path) -> list[Row]:
    """All rows of an events file, in file order; a line that is not a JSON object is an error."""
    rows: list[Row] = []
    try:
        with _open_text(path) as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as error:
                    raise EventsFileError(f"{path}:{number}: not JSON: {error}") from None
                if not isinstance(row, dict):
                    raise EventsFileError(f"{path}:{number}: expected a JSON object per line")
                rows.append(row)
    except (OSError, zipfile.BadZipFile, UnicodeDecodeError) as error:
        raise EventsFileError(f"{path}: {error}") from None
    return rows


def write_events(path: Path, rows: Iterable[Row]) -> int:
    """Write rows one JSON object per line (gzip-compressed for a `.gz` path); returns the count."""
    opener = gzip.open if path.suffix == ".gz" else open
    count = 0
    with opener(path, "wt", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
            count += 1
    return count


def event_time_ms(row: Row) -> float | None:
    """The row's time in epoch ms, for ordering and pacing; None when it has no valid time."""
    try:
        return float(time_of(row["Timestamp"]))
    except (KeyError, InvalidTime):
        return None


def order_times(rows: list[Row]) -> list[float]:
    """Each row's time for ordering: its own, or the one before it in the file when it has none."""
    times, previous = [], -math.inf
    for row in rows:
        time_ms = event_time_ms(row)
        previous = previous if time_ms is None else time_ms
        times.append(previous)
    return times


def in_order(rows: list[Row], order: str) -> list[Row]:
    """`time`: by event time (stable), so each machine emits its states in time order; `file`: as is."""
    if order == "file":
        return rows
    if order == "time":
        times = order_times(rows)
        return [rows[index] for index in sorted(range(len(rows)), key=times.__getitem__)]
    raise EventsFileError(f"unknown order {order!r}; expected one of {', '.join(ORDERS)}")


def displaced(rows: list[Row], disorder_ms: int, seed: int) -> list[Row]:
    """The rows (in time order) in an arrival order with bounded disorder, each held back by a seeded random 0
    to `disorder_ms` ms of event time (`pipeline_core.disorder`, which the benchmarks' workloads use too)."""
    if disorder_ms < 0:
        raise ValueError("--disorder-ms must not be negative")
    return [rows[index] for index in arrival_order(order_times(rows), disorder_ms, seed)]


def delta_to_end_at(rows: list[Row], end_ms: int) -> int:
    """The shift (ms) that puts the newest of `rows` at `end_ms` (0 when none has a time)."""
    times = [time_ms for time_ms in map(event_time_ms, rows) if time_ms is not None]
    return end_ms - int(max(times)) if times else 0


def shifted(rows: list[Row], delta_ms: int) -> list[Row]:
    """The rows moved in time by `delta_ms`, their spacing kept (each time written in its own unit, or ISO-8601)."""
    moved = []
    for row in rows:
        if "Timestamp" in row:
            try:
                row = {**row, "Timestamp": shifted_time(row["Timestamp"], delta_ms)}
            except InvalidTime:
                pass  # no time to move: the row goes out as it is, for the connector to dead-letter
        moved.append(row)
    return moved


def ending_at(rows: list[Row], end_ms: int) -> list[Row]:
    """The rows moved in time, their spacing kept, so that the newest is at `end_ms`: a replay of an old sample
    then lands inside InfluxDB's retention policies (docs/operations.md), which refuse older points."""
    return shifted(rows, delta_to_end_at(rows, end_ms))


def repeat(rows: list[Row]) -> Iterator[Row]:
    """The rows again and again, each pass later in time than the one before and with fresh ids.

    A machine never goes back in time across passes, and a repeated state is a new state, not a
    duplicate of the first pass. Each time is shifted as it is written (its unit, or ISO-8601).
    """
    if not rows:
        return
    times = [time_ms for time_ms in map(event_time_ms, rows) if time_ms is not None]
    period = max(times) - min(times) + 1 if times else 1
    period = int(period) if period.is_integer() else period
    yield from rows
    passes = 1
    while True:
        shift = passes * period
        for row in rows:
            shifted = dict(row)
            if "Timestamp" in row:
                try:
                    shifted["Timestamp"] = shifted_time(row["Timestamp"], shift)
                except InvalidTime:
                    pass  # no time to shift: the row goes out as it is, for the connector to dead-letter
            if "id" in row:
                shifted["id"] = f"{row['id']}/{passes}"
            yield shifted
        passes += 1
