"""`decode_record` for a whole column of payloads at once, with Arrow's JSON reader.

Gives, for every payload, what `pipeline_core.records.decode_record` gives: the record's fields, or the
reason it is invalid. Arrow parses the payloads that look like one compact JSON object per line in one
call, and the rules of `pipeline_core.validation` are applied as columns (names once per distinct
value); whatever it cannot vouch for (a missing or invalid field, a time out of range, a non-finite or
huge result, a payload on several lines, one Arrow refuses) goes through `decode_record` itself, so the
rules and the reasons stay defined once. The fast path only ever accepts what `decode_record` accepts,
with the same values.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from .record_keys import KEY_ESCAPE, KEY_SEPARATOR, key_prefix
from .records import InvalidRecord, decode_record
from .timestamps import EARLIEST_MS, LATEST_MS
from .validation import name_problem

_FIELDS = pa.schema([
    pa.field("thing", pa.string()),
    pa.field("quantity", pa.string()),
    pa.field("phenomenonTime", pa.float64()),
    pa.field("result", pa.float64()),
])
_PARSE_OPTIONS = pa_json.ParseOptions(explicit_schema=_FIELDS, unexpected_field_behavior="ignore",
                                      newlines_in_values=False)
# Results at or beyond this magnitude take decode_record's path: below it, float64 holds every integer
# exactly, so Arrow's value and Python's float() of the same JSON number agree. (Valid times lie far below.)
_EXACT_LIMIT = 2.0 ** 53
_OPEN_BRACE, _NEWLINE, _RETURN = ord("{"), ord("\n"), ord("\r")
_SEPARATOR_BYTE, _ESCAPE_BYTE = ord(KEY_SEPARATOR), ord(KEY_ESCAPE)


class RecordColumns(NamedTuple):
    """The valid records of a column of payloads (in payload order), and the rows of the invalid ones."""

    rows: np.ndarray  # int64: the payload row of each valid record, ascending
    thing: pa.Array  # string
    quantity: pa.Array  # string
    time: np.ndarray  # float64 epoch ms (phenomenonTime as it is)
    result: np.ndarray  # float64
    rejected: np.ndarray  # int64: payload rows that are not valid records
    reasons: list[str]  # why, per rejected row (decode_record's reason)


def decode_record_columns(payloads: pa.Array) -> RecordColumns:
    """Validate and decode a binary column of machine.data payloads (nulls allowed)."""
    payloads = payloads.combine_chunks() if isinstance(payloads, pa.ChunkedArray) else payloads
    candidates = _one_object_per_line(payloads)
    fast_rows = np.flatnonzero(candidates)
    parsed = _parse(payloads.filter(pa.array(candidates))) if len(fast_rows) else None
    if parsed is None:
        fast_rows = fast_rows[:0]
        accepted = np.zeros(0, dtype=bool)
    else:
        accepted = _plainly_valid(parsed)
        parsed = parsed.filter(pa.array(accepted))
    slow_rows = np.setdiff1d(np.arange(len(payloads)), fast_rows[accepted], assume_unique=True)
    fast = RecordColumns(fast_rows[accepted], *(_columns(parsed) if parsed is not None else _no_columns()),
                         np.zeros(0, dtype=np.int64), [])
    return _merge(fast, _decode_one_by_one(payloads, slow_rows))


def _one_object_per_line(payloads: pa.Array) -> np.ndarray:
    """bool per payload: not null, starts with '{', on one line; what the JSON reader gets as one row each."""
    count = len(payloads)
    offsets = np.frombuffer(payloads.buffers()[1], dtype=np.int32)[payloads.offset:payloads.offset + count + 1]
    data_buffer = payloads.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, dtype=np.uint8)
    starts, ends = offsets[:-1], offsets[1:]
    candidates = ends > starts
    if payloads.null_count:
        candidates &= payloads.is_valid().to_numpy(zero_copy_only=False)
    first = np.zeros(count, dtype=np.uint8)
    first[candidates] = data[starts[candidates]]
    candidates &= first == _OPEN_BRACE
    # Rows holding a line break (rare, so their positions are few): the row each break falls in.
    used = data[offsets[0]:offsets[-1]]
    breaks = np.flatnonzero((used == _NEWLINE) | (used == _RETURN)) + offsets[0]
    if len(breaks):
        candidates[np.searchsorted(ends, breaks, side="right")] = False
    return candidates


def _parse(payloads: pa.Array) -> pa.Table | None:
    """The four fields of each payload (one JSON object per line), or None if Arrow refuses any of them."""
    try:
        payloads.cast(pa.string())  # raises on bytes that are not UTF-8, which decode_record refuses
        offsets = np.frombuffer(payloads.buffers()[1], dtype=np.int32)[payloads.offset:payloads.offset + len(payloads) + 1]
        data = np.frombuffer(payloads.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[-1]]
        lines = np.insert(data, offsets[1:] - offsets[0], _NEWLINE)
        read_options = pa_json.ReadOptions(use_threads=False, block_size=max(len(lines) + 1, 1 << 20))
        table = pa_json.read_json(pa.py_buffer(lines), read_options=read_options, parse_options=_PARSE_OPTIONS)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return table if table.num_rows == len(payloads) else None


def _plainly_valid(parsed: pa.Table) -> np.ndarray:
    """bool per parsed row: thing and quantity valid names (`pipeline_core.validation`, judged once per
    distinct value), the time in the valid range, the result finite and exactly as Python reads it; a
    negative zero is left to decode_record (JSON's -0 is the int 0 there, -0.0 in Arrow)."""
    valid = np.ones(parsed.num_rows, dtype=bool)
    for name in ("thing", "quantity"):
        encoded = parsed.column(name).combine_chunks().dictionary_encode()
        good = np.array([name_problem(value) is None for value in encoded.dictionary.to_pylist()] + [False])
        codes = encoded.indices.fill_null(len(encoded.dictionary)).to_numpy(zero_copy_only=False)
        valid &= good[codes]
    times = parsed.column("phenomenonTime").to_numpy(zero_copy_only=False)  # NaN where null
    results = parsed.column("result").to_numpy(zero_copy_only=False)
    with np.errstate(invalid="ignore"):
        valid &= (times >= EARLIEST_MS) & (times < LATEST_MS)
        valid &= np.abs(results) < _EXACT_LIMIT
    valid &= ~((results == 0) & np.signbit(results))
    return valid


def _columns(parsed: pa.Table) -> tuple[pa.Array, pa.Array, np.ndarray, np.ndarray]:
    return (parsed.column("thing").combine_chunks(), parsed.column("quantity").combine_chunks(),
            parsed.column("phenomenonTime").to_numpy(), parsed.column("result").to_numpy())


def _no_columns() -> tuple[pa.Array, pa.Array, np.ndarray, np.ndarray]:
    return pa.array([], pa.string()), pa.array([], pa.string()), np.zeros(0), np.zeros(0)


def _decode_one_by_one(payloads: pa.Array, rows: np.ndarray) -> RecordColumns:
    """decode_record, payload by payload: the rows the fast path did not accept."""
    valid_rows: list[int] = []
    records = []
    rejected: list[int] = []
    reasons: list[str] = []
    for row in rows.tolist():
        try:
            record = decode_record(payloads[row].as_py())
        except InvalidRecord as error:
            rejected.append(row)
            reasons.append(str(error))
            continue
        records.append(record)
        valid_rows.append(row)
    return RecordColumns(
        np.array(valid_rows, dtype=np.int64),
        pa.array([record["thing"] for record in records], pa.string()),
        pa.array([record["quantity"] for record in records], pa.string()),
        np.array([record["phenomenonTime"] for record in records], dtype=np.float64),
        np.array([record["result"] for record in records], dtype=np.float64),
        np.array(rejected, dtype=np.int64), reasons)


def _merge(fast: RecordColumns, slow: RecordColumns) -> RecordColumns:
    if not len(slow.rows) and not len(slow.rejected):
        return fast
    if not len(fast.rows):
        return slow
    rows = np.concatenate([fast.rows, slow.rows])
    order = np.argsort(rows, kind="stable")
    taken = pa.array(order)
    return RecordColumns(rows[order], pa.concat_arrays([fast.thing, slow.thing]).take(taken),
                         pa.concat_arrays([fast.quantity, slow.quantity]).take(taken),
                         np.concatenate([fast.time, slow.time])[order], np.concatenate([fast.result, slow.result])[order],
                         slow.rejected, slow.reasons)


def key_column(things: pa.Array, quantities: pa.Array) -> pa.Array:
    """Each record's Kafka key (`pipeline_core.record_keys.record_key`) as a binary column: the things' key
    prefixes made once per distinct thing, and not at all when no thing holds a character to escape (nearly
    always: a look at the column's bytes)."""
    data = things.buffers()[2]
    text = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
    if not np.any((text == _SEPARATOR_BYTE) | (text == _ESCAPE_BYTE)):
        return pc.binary_join_element_wise(things, quantities, KEY_SEPARATOR).cast(pa.binary())
    encoded = things.dictionary_encode()
    prefixes = pa.array([key_prefix(thing) for thing in encoded.dictionary.to_pylist()], pa.string())
    return pc.binary_join_element_wise(prefixes.take(encoded.indices), quantities, "").cast(pa.binary())
