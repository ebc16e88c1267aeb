"""decode_record_columns gives, payload for payload, what decode_record gives: fuzzed with hypothesis."""
from __future__ import annotations

import json

import numpy as np
import orjson
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline_core.record_columns import decode_record_columns
from pipeline_core.records import InvalidRecord, decode_record
from pipeline_core.timestamps import EARLIEST_MS, LATEST_MS

FIELDS = ("thing", "quantity", "phenomenonTime", "result")
# Names as they come: mostly plain, some with what the validation refuses (dots in things, backslashes,
# control characters, lone surrogates, other unprintable code points).
characters = st.one_of(st.characters(codec="utf-8"), st.characters(categories=["Cs", "Cc", "Cf", "Co", "Zl", "Zs"]),
                       st.sampled_from(list('.\\ "\n\t')))
texts = st.one_of(st.text(characters, max_size=8), st.sampled_from(["R0815", "actSpeed_C11", "Säge 4", "x" * 300]))
times = st.one_of(st.integers(EARLIEST_MS, LATEST_MS - 1), st.integers(EARLIEST_MS, LATEST_MS - 1).map(lambda t: t + 0.25),
                  st.sampled_from([EARLIEST_MS - 1, LATEST_MS, 1554096460, 1554096460415000]))
numbers = st.one_of(
    times,
    st.integers(min_value=-2**70, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -0.0, 2**53, 2**53 + 1, 1e308, 5e-324]),
)
values = st.one_of(texts, numbers, st.booleans(), st.none(), st.lists(st.integers(), max_size=2),
                   st.dictionaries(texts, st.integers(), max_size=2))


@st.composite
def records(draw) -> dict:
    """Mostly well-formed records, each field sometimes missing or of another type, sometimes extra fields."""
    record = {}
    for name in FIELDS:
        if draw(st.integers(0, 9)) == 0:
            continue  # missing
        if draw(st.integers(0, 3)) == 0:
            record[name] = draw(values)
        elif name in ("thing", "quantity"):
            record[name] = draw(texts)
        else:
            record[name] = draw(numbers)
    if draw(st.booleans()):
        record["id"] = draw(values)
    return record


def encoded(record: dict, style: int) -> bytes:
    """The record as JSON: compact, spaced, on several lines, or with NaN/Infinity literals allowed."""
    if style == 0:
        return json.dumps(record, separators=(",", ":")).encode()
    if style == 1:
        return json.dumps(record).encode()
    if style == 2:
        return json.dumps(record, indent=1).encode()
    return json.dumps(record, ensure_ascii=False).encode("utf-8", "surrogatepass")


garbage = st.one_of(st.binary(max_size=20), st.sampled_from([
    b"", b" ", b"[1]", b"5", b'"x"', b"null", b"{", b"{}", b'{"thing":"a","thing":"b","quantity":"q","phenomenonTime":1,"result":2}',
    b'{"thing":"a","quantity":"q","phenomenonTime":1,"result":2} x', b'{"thing":"a","quantity":"q","phenomenonTime":1,"result":2}{}',
    b'{"thing":"a","quantity":"q","phenomenonTime":1,"result":2,}', b'{"thing":"\\ud800","quantity":"q","phenomenonTime":1,"result":2}',
    b'{"thing":"a\xff","quantity":"q","phenomenonTime":1,"result":2}', b'\xef\xbb\xbf{"thing":"a","quantity":"q","phenomenonTime":1,"result":2}',
    b'{"thing":"a","quantity":"q","phenomenonTime":-0,"result":-0}', b'{"thing":"a","quantity":"q","phenomenonTime":1E400,"result":2}',
    b'{"thing":"a","quantity":"q","phenomenonTime":1,"result":2,"x":[1,{"y":null}]}',
]))
payloads = st.one_of(
    st.builds(encoded, records(), st.integers(0, 3)),
    st.builds(lambda record: orjson.dumps(record), st.fixed_dictionaries({
        "thing": st.text(min_size=1, max_size=6), "quantity": st.text(min_size=1, max_size=6),
        "phenomenonTime": st.integers(EARLIEST_MS, LATEST_MS - 1),
        "result": st.floats(allow_nan=False, allow_infinity=False)})),
    garbage,
    st.none(),
)


def expected(payload: bytes | None) -> tuple:
    """What decode_record says: the fields as the columns hold them, or the reason."""
    try:
        record = decode_record(payload)
    except InvalidRecord as error:
        return ("rejected", str(error))
    return ("valid", record["thing"], record["quantity"], float(np.float64(record["phenomenonTime"])),
            float(np.float64(record["result"])))


def decoded(batch: list[bytes | None]) -> list[tuple]:
    columns = decode_record_columns(pa.array(batch, pa.binary()))
    found: dict[int, tuple] = {}
    for row, thing, quantity, time, result in zip(columns.rows.tolist(), columns.thing.to_pylist(),
                                                  columns.quantity.to_pylist(), columns.time.tolist(),
                                                  columns.result.tolist()):
        found[row] = ("valid", thing, quantity, time, result)
    for row, reason in zip(columns.rejected.tolist(), columns.reasons):
        found[row] = ("rejected", reason)
    assert sorted(found) == list(range(len(batch))), "every payload is either a record or rejected"
    return [found[row] for row in range(len(batch))]


def same(mine: tuple, theirs: tuple) -> bool:
    # float equality that also holds for -0.0 against 0.0 only where decode_record gives the same sign
    return mine == theirs and all(np.signbit(a) == np.signbit(b) for a, b in zip(mine[3:], theirs[3:]))


@settings(max_examples=300, deadline=None)
@given(st.lists(payloads, min_size=1, max_size=30))
def test_columns_decode_as_decode_record_does(batch) -> None:
    mine = decoded(batch)
    for payload, got in zip(batch, mine):
        assert same(got, expected(payload)), payload


@settings(max_examples=100, deadline=None)
@given(st.lists(payloads, min_size=1, max_size=30), st.integers(0, 5))
def test_a_slice_of_a_larger_column_decodes_alike(batch, start) -> None:
    """Spark hands over slices of Arrow buffers: offsets that do not start at zero."""
    column = pa.array([b'{"thing":"a","quantity":"q","phenomenonTime":1,"result":2}\n'] * start + batch, pa.binary())
    sliced = column.slice(start)
    assert [row[1:] for row in decoded_column(sliced)] == [row[1:] for row in decoded(batch)]


def decoded_column(column: pa.Array) -> list[tuple]:
    columns = decode_record_columns(column)
    found = {row: ("valid", thing, quantity, time, result) for row, thing, quantity, time, result in zip(
        columns.rows.tolist(), columns.thing.to_pylist(), columns.quantity.to_pylist(), columns.time.tolist(),
        columns.result.tolist())}
    found.update({row: ("rejected", reason) for row, reason in zip(columns.rejected.tolist(), columns.reasons)})
    return [found[row] for row in range(len(column))]


def test_compact_records_are_decoded_by_arrow_alone(monkeypatch) -> None:
    """The point of the columns: well-formed records never reach decode_record one by one."""
    import pipeline_core.record_columns as record_columns

    def refuse(payload):
        raise AssertionError(f"decoded one by one: {payload!r}")

    batch = [orjson.dumps({"thing": f"M{i}", "quantity": "actSpeed_C11", "phenomenonTime": 1554096460415 + i,
                           "result": i / 7, "id": str(i)}) for i in range(1000)]
    monkeypatch.setattr(record_columns, "decode_record", refuse)
    columns = decode_record_columns(pa.array(batch, pa.binary()))
    assert columns.rows.tolist() == list(range(1000)) and not len(columns.rejected)
    assert columns.time.tolist() == [1554096460415 + i for i in range(1000)]
    assert columns.result.tolist() == [i / 7 for i in range(1000)]
