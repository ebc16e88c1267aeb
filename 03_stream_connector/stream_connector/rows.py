"""Split one MQTT machine-state row into machine.data records, and say what was rejected and why.

A row is a JSON object ``{"Thing": ..., "Timestamp": ..., "id": ..., <quantity>: <number>, ...}``.
Every other key is a quantity and becomes one record. A row that cannot be read at all (too big,
not JSON, no thing or time) is rejected whole; otherwise each good quantity passes and the bad ones
are listed, so one bad value never costs the good values of the same row.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from pipeline_core.timestamps import to_epoch_ms
from pipeline_core.records import MachineRecord, is_finite_number

THING = "Thing"
TIMESTAMP = "Timestamp"
ROW_ID = "id"
ROW_FIELDS = frozenset((THING, TIMESTAMP, ROW_ID))


@dataclass
class SplitRow:
    """The records of one row, plus the reason for everything that could not become a record."""

    records: list[MachineRecord] = field(default_factory=list)
    # Empty when the whole row was good; the row's reason when nothing of it could be read.
    rejections: list[str] = field(default_factory=list)
    rejected_quantities: list[str] = field(default_factory=list)


def event_time_ms(value: Any) -> int | float:
    """Epoch milliseconds from s, ms, µs, ns or ISO-8601, as an int whenever it is whole.

    Raises ValueError for anything that is not a finite time.
    """
    if isinstance(value, float) and not math.isfinite(value):
        # Checked here: the engine's to_epoch_ms divides infinity by 1000 without end.
        raise ValueError(f"Timestamp {value!r} is not a finite time")
    try:
        millis = to_epoch_ms(value)
    except (TypeError, ValueError, OverflowError) as error:
        raise ValueError(f"Timestamp {value!r} is not a time: {error}") from None
    if not is_finite_number(millis):
        raise ValueError(f"Timestamp {value!r} is not a finite time")
    if isinstance(millis, float):
        # Seconds as floats carry binary noise (1554096380.468 s -> ...468.0002 ms): keep µs precision.
        millis = round(millis, 3)
        if millis.is_integer():
            return int(millis)
    return millis


def _describe(value: Any) -> str:
    text = json.dumps(value, default=repr)  # NaN and Infinity as JSON spells them
    return text if len(text) <= 80 else text[:77] + "..."


def split_row(payload: bytes, max_payload_bytes: int) -> SplitRow:
    """Parse `payload` and return its records (in the row's key order) and any rejections."""
    result = SplitRow()
    if len(payload) > max_payload_bytes:
        result.rejections.append(f"payload of {len(payload)} bytes exceeds the limit of {max_payload_bytes}")
        return result
    try:
        row = json.loads(payload)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        result.rejections.append(f"malformed JSON: {error}")
        return result
    if not isinstance(row, dict):
        result.rejections.append(f"expected a JSON object, got {type(row).__name__}")
        return result
    thing = row.get(THING)
    if not isinstance(thing, str) or not thing:
        result.rejections.append(f"{THING} must be a non-empty string, got {_describe(thing)}"
                                 if THING in row else f"missing field {THING}")
        return result
    if TIMESTAMP not in row:
        result.rejections.append(f"missing field {TIMESTAMP}")
        return result
    try:
        time_ms = event_time_ms(row[TIMESTAMP])
    except ValueError as error:
        result.rejections.append(str(error))
        return result
    row_id = row.get(ROW_ID)
    for quantity, value in row.items():
        if quantity in ROW_FIELDS:
            continue
        if not is_finite_number(value):
            result.rejected_quantities.append(quantity)
            result.rejections.append(f"{quantity}: {_describe(value)} is not a finite number")
            continue
        # A result is a float from here on, as InfluxDB stores it: an integer written once would
        # make the field an integer field, and one beyond 64 bits would not survive JSON parsers.
        record: MachineRecord = {"thing": thing, "quantity": quantity, "phenomenonTime": time_ms,
                                 "result": float(value)}
        if row_id is not None:
            record["id"] = str(row_id)
        result.records.append(record)
    if not result.records and not result.rejections:
        result.rejections.append("row carries no quantity")
    return result
