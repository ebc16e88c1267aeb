"""`decode_record` for a whole column of payloads at once, with Arrow's JSON reader.

Gives, for every payload, what `pipeline_core.records.decode_record` gives: the record's fields, or the
reason it is invalid. Arrow parses the payloads that look like one compact JSON object per line in one
call; whatever it cannot vouch for (a null or empty field, a non-finite or huge number, a payload on
several lines, one Arrow refuses) goes through `decode_record` itself, so the rules and the reasons stay
defined once. The fast path only ever accepts what `decode_record` accepts, with the same values. One
rule is added: text that UTF-8 cannot encode (a lone surrogate) is invalid, since no column holds it.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from .records import InvalidRecord, decode_record

_FIELDS = pa.schema([
    pa.field("thing", pa.string()),
    pa.field("quantity", pa.string()),
    pa.field("phenomenonTime", pa.float64()),
    pa.field("result", pa.float64()),
])
_PARSE_OPTIONS = pa_json.ParseOptions(explicit_schema=_FIELDS, unexpected_field_behavior="ignore",
                                      newlines_in_values=False)
# Numbers at or beyond this magnitude take decode_record's path: below it, float64 holds every integer
# exactly, so Arrow's value and Python's float() of the same JSON number agree.
_EXACT_LIMIT = 2.0 ** 53
_OPEN_BRACE, _NEWLINE, _RETURN = ord("{"), ord("\n"), ord("\r")


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
    """bool per parsed row: every field present and non-empty, both numbers finite and exactly as Python
    reads them; a negative zero is left to decode_record (JSON's -0 is the int 0 there, -0.0 in Arrow)."""
    valid = np.ones(parsed.num_rows, dtype=bool)
    for name in ("thing", "quantity"):
        column = parsed.column(name)
        valid &= pc.fill_null(pc.greater(pc.binary_length(column), 0), False).to_numpy(zero_copy_only=False)
    for name in ("phenomenonTime", "result"):
        values = parsed.column(name).to_numpy(zero_copy_only=False)  # NaN where null
        with np.errstate(invalid="ignore"):
            valid &= np.abs(values) < _EXACT_LIMIT
        valid &= ~((values == 0) & np.signbit(values))
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
            _require_utf8(record)
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


def _require_utf8(record: dict) -> None:
    """Text that UTF-8 cannot encode (a lone surrogate, written as an escape such as \\ud800, which
    decode_record's lenient parser lets through) can be neither a column nor a Kafka key: invalid here."""
    for name in ("thing", "quantity"):
        try:
            record[name].encode()
        except UnicodeEncodeError:
            raise InvalidRecord(f"{name} must be valid Unicode text, got {record[name]!r}") from None


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
