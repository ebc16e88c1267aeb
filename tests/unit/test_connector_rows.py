"""Splitting one MQTT row into machine.data records, and what gets rejected."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline_core.records import decode_record, encode_record
from stream_connector.rows import event_time_ms, split_row

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
                                   "2019-04-01T05:27:40.415Z", "2019-04-01T05:27:40.415+00:00",
                                   "2019-04-01T07:27:40.415+02:00", "2019-04-01T05:27:40.415"])
def test_timestamps_in_any_unit_become_integer_epoch_ms(value):
    assert event_time_ms(value) == T_MS
    assert isinstance(event_time_ms(value), int)


def test_sub_millisecond_precision_is_kept():
    assert event_time_ms(1554096460415123) == 1554096460415.123


@pytest.mark.parametrize("value", ["yesterday", None, True, [1], float("nan"), float("inf"), 10 ** 400])
def test_a_timestamp_that_is_no_time_is_rejected(value):
    with pytest.raises(ValueError):
        event_time_ms(value)


@pytest.mark.parametrize("payload, reason", [
    (b"{", "malformed JSON"),
    (b"\xff\xfe\xfa", "malformed JSON"),
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
