"""Split one MQTT machine-state row into machine.data records, and say what was rejected and why.

What a valid row is, is defined once in `pipeline_core.validation` (names, sizes, the row id) and
`pipeline_core.timestamps` (the time); this module applies it. A row that cannot be read at all
(too big, not UTF-8 JSON, not an object, no valid Thing, Timestamp or id, too many quantities) is
rejected whole; otherwise each good quantity passes and the bad ones are listed, so one bad value
never costs the good values of the same row.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import orjson

from pipeline_core.partitioning import thing_partition
from pipeline_core.records import MachineRecord, encode_record, record_key
from pipeline_core.timestamps import InvalidTime, event_time_ms
from pipeline_core.validation import (DEFAULT_MAX_QUANTITIES, ROW_FIELDS, ROW_ID, THING, TIMESTAMP, describe,
                                      is_finite_number, label, name_problem, row_id_problem)


@dataclass
class SplitRow:
    """The records of one row, plus the reason for everything that could not become a record."""

    records: list[MachineRecord] = field(default_factory=list)
    # Empty when the whole row was good; the row's reason when nothing of it could be read.
    rejections: list[str] = field(default_factory=list)
    rejected_quantities: list[str] = field(default_factory=list)


class RejectedRow(ValueError):
    """A row nothing of which can become a record; the message is the reason."""


def parse_row(payload: bytes) -> dict[str, Any]:
    """The row's JSON object, or `RejectedRow`. orjson reads the valid rows; only a row it refuses is
    parsed again by the standard library, which reads NaN, Infinity and escaped lone surrogates, so
    the reason can name the offending field instead of just "malformed JSON"."""
    try:
        row = orjson.loads(payload)
    except orjson.JSONDecodeError:
        try:
            row = json.loads(payload.decode("utf-8"))
        except UnicodeDecodeError as error:
            raise RejectedRow(f"malformed JSON: not UTF-8 ({error.reason} at byte {error.start})") from None
        # ValueError: also an integer of more digits than Python converts; RecursionError: deep nesting.
        except (ValueError, RecursionError) as error:
            raise RejectedRow(f"malformed JSON: {error}") from None
    if type(row) is not dict:
        raise RejectedRow(f"expected a JSON object, got {type(row).__name__}")
    return row


def _row_fields(row: dict[str, Any], max_quantities: int) -> tuple[str, int | float, str | None]:
    """(thing, time in epoch ms, id as text or None) of a row, or `RejectedRow`."""
    if THING not in row:
        raise RejectedRow(f"missing field {THING}")
    thing = row[THING]
    if type(thing) is not str or not thing:
        raise RejectedRow(f"{THING} must be a non-empty string, got {describe(thing)}")
    problem = name_problem(thing)
    if problem is not None:
        raise RejectedRow(f"{THING} {describe(thing)} {problem}")
    if TIMESTAMP not in row:
        raise RejectedRow(f"missing field {TIMESTAMP}")
    try:
        time_ms = event_time_ms(row[TIMESTAMP])
    except InvalidTime as error:
        raise RejectedRow(f"{TIMESTAMP} {error}") from None
    row_id = row.get(ROW_ID)
    if row_id is not None:
        problem = row_id_problem(row_id)
        if problem is not None:
            raise RejectedRow(f"{ROW_ID} {describe(row_id)} {problem}")
        row_id = str(row_id)
    quantities = len(row) - len(ROW_FIELDS.intersection(row))
    if quantities > max_quantities:
        raise RejectedRow(f"row carries {quantities} quantities, over the limit of {max_quantities}")
    return thing, time_ms, row_id


def split_row(payload: bytes, max_payload_bytes: int, max_quantities: int = DEFAULT_MAX_QUANTITIES) -> SplitRow:
    """Parse `payload` and return its records (in the row's key order) and any rejections."""
    result = SplitRow()
    if len(payload) > max_payload_bytes:
        result.rejections.append(f"payload of {len(payload)} bytes exceeds the limit of {max_payload_bytes}")
        return result
    try:
        row = parse_row(payload)
        thing, time_ms, row_id = _row_fields(row, max_quantities)
    except RejectedRow as rejected:
        result.rejections.append(str(rejected))
        return result
    for quantity, value in row.items():
        if quantity in ROW_FIELDS:
            continue
        problem = name_problem(quantity)
        if problem is not None:
            result.rejected_quantities.append(quantity)
            result.rejections.append(f"quantity name {describe(quantity)} {problem}")
            continue
        if not is_finite_number(value):
            result.rejected_quantities.append(quantity)
            result.rejections.append(f"{label(quantity)}: {describe(value)} is not a finite number")
            continue
        # A result is a float from here on, as InfluxDB stores it: an integer written once would
        # make the field an integer field, and one beyond 64 bits would not survive JSON parsers.
        record: MachineRecord = {"thing": thing, "quantity": quantity, "phenomenonTime": time_ms,
                                 "result": float(value)}
        if row_id is not None:
            record["id"] = row_id
        result.records.append(record)
    if not result.records and not result.rejections:
        result.rejections.append("row carries no quantity")
    return result


def kafka_messages(records: list[MachineRecord], partitions: int) -> list[tuple[bytes, bytes, int]]:
    """(value, key, partition) of each record on machine.data: the record's JSON, its key
    (`pipeline_core.record_keys.record_key`), the partition of its thing (`pipeline_core.partitioning`)."""
    return [(encode_record(record), record_key(record["thing"], record["quantity"]).encode(),
             thing_partition(record["thing"], partitions)) for record in records]
