"""Splitting one MQTT row into machine.data records, and what gets rejected."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline_core.records import decode_record, encode_record
from stream_connector.rows import split_row

LIMIT = 1_000_000
T_MS = 1_554_096_460_415


def split(row) -> tuple[list[dict], list[str]]:
    result = split_row(json.dumps(row).encode() if not isinstance(row, bytes) else row, LIMIT)
    return result.records, result.rejections


def test_every_quantity_becomes_one_record_with_the_row_id():
    records, rejections = split({"Thing": "R0815", "Timestamp": T_MS, "vaLoad_C11": 1.6, "turnState_C11": 3,
                                 "id": "row-1"})
    assert rejections == []
    assert records == [
        {"thing": "R0815", "quantity": "vaLoad_C11", "phenomenonTime": T_MS, "result": 1.6, "id": "row-1"},
        {"thing": "R0815", "quantity": "turnState_C11", "phenomenonTime": T_MS, "result": 3, "id": "row-1"}]
    for record in records:
        assert decode_record(encode_record(record)) == record


@pytest.mark.parametrize("value", [1554096460.415, 1554096460415, 1554096460415000, 1554096460415000000,
                                   "2019-04-01T05:27:40.415Z", "2019-04-01T05:27:40.415"])
def test_timestamps_in_any_unit_become_integer_epoch_ms(value):
    records, rejections = split({"Thing": "M", "Timestamp": value, "q": 1.0})
    assert rejections == [] and records[0]["phenomenonTime"] == T_MS
    assert type(records[0]["phenomenonTime"]) is int


@pytest.mark.parametrize("value, reason", [
    ("yesterday", "Timestamp \"yesterday\" is not a time"), (None, "Timestamp null is not a time"),
    (True, "is not a time"), ([1], "is not a time"), (float("nan"), "Timestamp NaN is not a finite time"),
    (float("inf"), "not a finite time"), (10 ** 400, "outside the valid time range"),
    (1e20, "Timestamp 1e+20 is outside the valid time range"), (1e300, "outside the valid time range"),
    (-1, "outside the valid time range")])
def test_a_timestamp_that_is_no_time_rejects_the_row(value, reason):
    records, rejections = split({"Thing": "M", "Timestamp": value, "q": 1.0})
    assert records == [] and len(rejections) == 1 and reason in rejections[0]


@pytest.mark.parametrize("payload, reason", [
    (b"{", "malformed JSON"),
    (b"\xff\xfe\xfa", "malformed JSON: not UTF-8"),
    (b'{"Thing": "\xed\xa0\x80", "Timestamp": 1554096460415, "q": 1}', "malformed JSON: not UTF-8"),
    (b'{"Thing": "\\ud800", "Timestamp": 1554096460415, "q": 1}', 'Thing "\\ud800" is no text'),
    (b'{"Thing": "' + b"R" * 257 + b'", "Timestamp": 1554096460415, "q": 1}', "longer than 256 characters"),
    (b'{"Thing": "M", "Timestamp": 1554096460415, "id": {"a": 1}, "q": 1}', "id {\"a\": 1} must be a string"),
    (b'{"Thing": "M", "Timestamp": 1554096460415, "id": "", "q": 1}', "id \"\" must have 1 to 256"),
    (b'{"Thing": "M", "Timestamp": 1554096460415, "id": "' + b"i" * 257 + b'", "q": 1}', "must have 1 to 256"),
    (b"1" + b"0" * 5000, "malformed JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "malformed JSON"),
    (b'"text"', "expected a JSON object, got str"),
    (b'{"Timestamp": 1, "q": 1}', "missing field Thing"),
    (b'{"Thing": null, "Timestamp": 1, "q": 1}', "Thing must be a non-empty string"),
    (b'{"Thing": "M", "q": 1}', "missing field Timestamp"),
    (b'{"Thing": "M", "Timestamp": "soon", "q": 1}', "is not a time"),
    (b'{"Thing": "M", "Timestamp": 1554096460415, "id": "x"}', "row carries no quantity"),
])
def test_unreadable_rows_are_rejected_whole(payload, reason):
    result = split_row(payload, LIMIT)
    assert result.records == []
    assert len(result.rejections) == 1 and reason in result.rejections[0]


def test_oversized_payload_is_rejected_unread():
    result = split_row(b"{" + b" " * 100 + b"}", 50)
    assert result.records == [] and "exceeds the limit of 50" in result.rejections[0]


def test_a_row_over_the_quantity_limit_is_rejected_whole():
    row = {"Thing": "M", "Timestamp": T_MS, "id": "r", **{f"q{index}": 1.0 for index in range(11)}}
    result = split_row(json.dumps(row).encode(), LIMIT, max_quantities=10)
    assert result.records == [] and result.rejections == ["row carries 11 quantities, over the limit of 10"]
    assert len(split_row(json.dumps(row).encode(), LIMIT, max_quantities=11).records) == 11


@pytest.mark.parametrize("name, reason", [
    ("", 'quantity name "" is empty'), ("a\ud800", 'quantity name "a\\ud800" is no text'),
    ("x" * 300, "longer than 256")])
def test_a_bad_quantity_name_costs_only_that_quantity(name, reason):
    result = split_row(json.dumps({"Thing": "M", "Timestamp": T_MS, name: 1.0, "good": 2.0}).encode(), LIMIT)
    assert [record["quantity"] for record in result.records] == ["good"]
    assert result.rejected_quantities == [name] and reason in result.rejections[0]
    assert result.rejections[0].isascii()  # the name is quoted with its escapes


def test_an_integer_row_id_becomes_text():
    records, rejections = split({"Thing": "M", "Timestamp": T_MS, "q": 1.0, "id": 42})
    assert rejections == [] and records[0]["id"] == "42"


def test_bad_values_are_rejected_and_the_good_ones_of_the_same_row_pass():
    payload = (b'{"Thing": "M", "Timestamp": 1554096460415, "good": 2.5, "nan": NaN, "inf": -Infinity, '
               b'"text": "3", "flag": false, "none": null, "list": [], "id": 7}')
    result = split_row(payload, LIMIT)
    assert [(r["quantity"], r["result"], r["id"]) for r in result.records] == [("good", 2.5, "7")]
    assert result.rejected_quantities == ["nan", "inf", "text", "flag", "none", "list"]
    assert len(result.rejections) == 6


anything = st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(),
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                        max_leaves=5)


@given(quantities=st.dictionaries(st.text(min_size=1).filter(lambda k: k not in ("Thing", "Timestamp", "id")),
                                  anything, max_size=6))
def test_each_quantity_is_either_a_record_or_a_rejection(quantities):
    row = {"Thing": "M", "Timestamp": T_MS, **quantities}
    result = split_row(json.dumps(row).encode(), LIMIT)
    passed = [record["quantity"] for record in result.records]
    assert sorted(passed + result.rejected_quantities) == sorted(quantities)
    for record in result.records:
        assert math.isfinite(record["result"]) and decode_record(encode_record(record)) == record
