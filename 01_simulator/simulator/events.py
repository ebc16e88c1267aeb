"""Events files: one JSON row per line, plain, `.gz` or `.zip`; their replay order and repetition."""
from __future__ import annotations

import gzip
import io
import json
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from pipeline_core.timestamps import to_epoch_ms

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


def event_time_ms(row: Row) -> float:
    """The row's Timestamp in epoch ms (any unit or ISO-8601), for ordering and pacing."""
    try:
        return float(to_epoch_ms(row["Timestamp"]))
    except (KeyError, TypeError, ValueError) as error:
        raise EventsFileError(f"row {row.get('id', '?')}: no usable Timestamp ({error!r})") from None


def in_order(rows: list[Row], order: str) -> list[Row]:
    """`time`: by event time (stable), so each machine emits its states in time order; `file`: as is."""
    if order == "file":
        return rows
    if order == "time":
        return sorted(rows, key=event_time_ms)
    raise EventsFileError(f"unknown order {order!r}; expected one of {', '.join(ORDERS)}")


def repeat(rows: list[Row]) -> Iterator[Row]:
    """The rows again and again, each pass later in time than the one before and with fresh ids.

    A machine never goes back in time across passes, and a repeated state is a new state, not a
    duplicate of the first pass.
    """
    if not rows:
        return
    times = [event_time_ms(row) for row in rows]
    period = max(times) - min(times) + 1
    yield from rows
    passes = 1
    while True:
        shift = passes * period
        for row, time_ms in zip(rows, times):
            shifted = dict(row, Timestamp=int(time_ms + shift) if time_ms.is_integer() else time_ms + shift)
            if "id" in row:
                shifted["id"] = f"{row['id']}/{passes}"
            yield shifted
        passes += 1
