"""What a valid machine-state row is: the one definition the stream connector applies, and the
part of it every later stage checks again on each record (`pipeline_core.records.decode_record`).

A row is one MQTT message, a JSON object in UTF-8::

    {"Thing": "R0815", "Timestamp": 1554096460415, "id": "c352b79d", "actSpeed_C11": 288.2, ...}

* **Size**: at most `--max-payload-bytes` (default `DEFAULT_MAX_ROW_BYTES`, 64 KiB) and at most
  `--max-quantities` quantities (default `DEFAULT_MAX_QUANTITIES`, 1000); the stream connector's
  settings, so one row can neither fill the broker's queue nor multiply into a flood of records.
* **Thing**: a name (below). The record key carries it escaped (`pipeline_core.record_keys`), so dots and
  backslashes in a thing are data like any other character.
* **Timestamp**: a time as `pipeline_core.timestamps.event_time_ms` reads it: s, ms, µs or ns since
  1970 by magnitude, or ISO-8601, within 2000-01-01 to 2100-01-01 UTC. machine.data carries it as
  epoch milliseconds, which every later stage trusts as they are.
* **id** (optional): a string or an integer of at most `MAX_ID_LENGTH` printable characters.
* **quantities**: every other key; its name is a name (below), its value a finite number (JSON
  numbers only: not ``true``, not ``"3"``, not ``NaN``).

A **name** (thing, quantity, a join result's case) is any text of 1 to `MAX_NAME_LENGTH` (256) characters
(Unicode code points): dots, backslashes, spaces, slashes, quotes, commas, ``=``, MQTT wildcards, any script,
control characters (tab, line feed, NUL), format, private-use, unassigned and separator characters are all
data. Only what is no text is refused: a lone surrogate (JSON's ``"\\ud800"`` escape, or the raw bytes
``ED A0 80``, which are no UTF-8), as UTF-8 cannot carry it. Each place a name meets a syntax carries it
unambiguously: the Kafka key (`pipeline_core.record_keys`), InfluxDB's line protocol and InfluxQL
(`pipeline_core.influx.stored_name`), an MQTT topic level (the simulator puts a name Mosquitto refuses in a
topic under its fallback topic), a dead letter's reason (`describe`, `label`).
"""
from __future__ import annotations

import functools
import json
import math
from typing import Any

THING = "Thing"
TIMESTAMP = "Timestamp"
ROW_ID = "id"
ROW_FIELDS = frozenset((THING, TIMESTAMP, ROW_ID))

MAX_NAME_LENGTH = 256
MAX_ID_LENGTH = 256
DEFAULT_MAX_ROW_BYTES = 64 * 1024
DEFAULT_MAX_QUANTITIES = 1000


def name_problem(name: str) -> str | None:
    """Why `name` is no valid name, or None."""
    if len(name) > MAX_NAME_LENGTH:  # before the cache, which must not keep long strings
        return f"is longer than {MAX_NAME_LENGTH} characters"
    return _short_name_problem(name)


@functools.lru_cache(maxsize=1 << 17)  # a plant of 100,000 machines' names fits (thing_partition's reason)
def _short_name_problem(name: str) -> str | None:
    """`name_problem` of a name of at most MAX_NAME_LENGTH characters (cached: a pipeline sees few
    names, many times)."""
    if not name:
        return "is empty"
    if not name.isascii():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            return "is no text: it contains a lone surrogate, which UTF-8 cannot carry"
    return None


def row_id_problem(row_id: Any) -> str | None:
    """Why `row_id` is no valid row id, or None."""
    if isinstance(row_id, bool) or not isinstance(row_id, (str, int)):
        return "must be a string or an integer"
    if isinstance(row_id, int):
        return None if abs(row_id) < 10 ** (MAX_ID_LENGTH - 1) else f"is longer than {MAX_ID_LENGTH} characters"
    if not row_id or len(row_id) > MAX_ID_LENGTH:
        return f"must have 1 to {MAX_ID_LENGTH} characters"
    if not row_id.isprintable():
        return "contains a character that is not printable"
    return None


def is_finite_number(value: Any) -> bool:
    """True for int/float values that are finite as a float (bool is not a number here)."""
    if type(value) is float:
        return math.isfinite(value)
    if type(value) is int:  # epoch milliseconds mostly: the second common case, before the slower checks
        try:
            return math.isfinite(value)
        except OverflowError:  # beyond the float range
            return False
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond the float range
        return False


def describe(value: Any, limit: int = 80) -> str:
    """A value for a dead letter's reason: JSON (NaN as NaN), ASCII only, so a lone surrogate or a
    control character shows as its escape and never breaks what carries the reason; at most
    `limit` characters."""
    try:
        text = json.dumps(value, default=repr)
    except (ValueError, RecursionError):  # an integer too long for str(), a structure too deep
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def label(name: str) -> str:
    """A name as it appears in a reason: as it is when printable (`str.isprintable`), else quoted by `describe`,
    so a line feed or a lone surrogate of a name never breaks a log line or what carries the reason."""
    return name if name.isprintable() else describe(name)
