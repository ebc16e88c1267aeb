"""Whatever arrives, every stage's decode and encode path accepts it or dead-letters it with a
reason; none raises. Arbitrary bytes and arbitrary JSON (lone surrogates escaped and raw, control
characters, huge and non-finite numbers, deep nesting, odd time units, broken UTF-8) go through

* the stream connector: row -> records -> key, partition and value on machine.data, or a dead letter;
* `pipeline_core.records.decode_record` as both joiners read machine.data with it, and what they do
  with an accepted record (its key, its thing's partition, Arrow string columns);
* the DB connector: record -> line protocol, or a dead letter; and a dead letter -> its count point.
"""
from __future__ import annotations

import base64
import json
from datetime import datetime

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_joiner.repartition import FramedRecord, decode_frame, encode_frame, frame_records
from db_connector.points import PowerLevels, body, deadletter_point, record_line
from pipeline_core.partitioning import thing_partition
from pipeline_core.records import InvalidRecord, dead_letter, decode_record, record_key
from pipeline_core.timestamps import EARLIEST_MS, LATEST_MS
from stream_connector.rows import kafka_messages, split_row

PARTITIONS = 5
MAX_ROW_BYTES = 64 * 1024
MAX_QUANTITIES = 20
LEVELS = PowerLevels.parse("100,1000,5000")
EXAMPLES = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- strategies ----------------------------------------------------------------------------------

STRANGE_CHARACTERS = st.one_of(
    st.characters(),
    st.characters(categories=["Cs"]),  # lone surrogates
    st.characters(categories=["Cc", "Cf", "Co", "Cn", "Zl", "Zp", "Zs"]),
    st.sampled_from(list('.\\,= "\n\r\t\x00#')))
STRANGE_TEXT = st.one_of(
    st.text(STRANGE_CHARACTERS, max_size=12),
    st.sampled_from(["", "R0815", "actSpeed_C11", "vaTorque_C11", "x" * 300, "\ud800", "a.b", "a\\", "same_time"]))
NAMES = STRANGE_TEXT
NUMBERS = st.one_of(
    st.integers(), st.floats(), st.integers(min_value=-(10 ** 400), max_value=10 ** 400),
    st.sampled_from([1e20, 1e300, -0.0, float("nan"), float("inf"), -float("inf"), 2 ** 63, 2 ** 64 + 1]))
VALID_MS = st.integers(EARLIEST_MS, LATEST_MS - 1)
# Times in every unit and in none, ISO-8601 and not.
TIMES = st.one_of(
    VALID_MS, VALID_MS.map(lambda ms: ms / 1000), VALID_MS.map(lambda ms: ms * 1000),
    VALID_MS.map(lambda ms: ms * 1_000_000), st.datetimes(min_value=datetime(1, 1, 2)).map(datetime.isoformat),
    NUMBERS, STRANGE_TEXT)
JSON = st.recursive(st.none() | st.booleans() | NUMBERS | STRANGE_TEXT,
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(STRANGE_TEXT, inner, max_size=3),
                    max_leaves=8)


@st.composite
def json_bytes(draw, value_strategy) -> bytes:
    """A value as JSON bytes: NaN/Infinity as Python writes them, surrogates escaped or as raw bytes."""
    value = draw(value_strategy)
    if draw(st.booleans()):
        return json.dumps(value).encode()
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


@st.composite
def broken(draw, payloads) -> bytes:
    """A payload with bytes cut out or pushed in: broken UTF-8, cut-off JSON."""
    payload = draw(payloads)
    start = draw(st.integers(0, len(payload)))
    end = draw(st.integers(start, len(payload)))
    return payload[:start] + draw(st.binary(max_size=4)) + payload[end:]


GOOD_THINGS = st.sampled_from(["R0815", "M1", "Säge 4", "機械-7"])
GOOD_NAMES = GOOD_THINGS | st.sampled_from(["actSpeed_C11", "vaTorque_C11", "axis.speed", "q w=1,2"])
GOOD_TIMES = st.one_of(VALID_MS, VALID_MS.map(lambda ms: ms / 1000), VALID_MS.map(lambda ms: ms * 1000),
                       VALID_MS.map(lambda ms: ms * 1_000_000),
                       st.datetimes(min_value=datetime(2000, 1, 2), max_value=datetime(2099, 12, 30)).map(
                           datetime.isoformat))
GOOD_RESULTS = st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2 ** 70), 2 ** 70)


@st.composite
def spoiled(draw, good: dict, strange: dict) -> dict:
    """`good` with a few of its fields replaced by strange values, removed, or strange ones added."""
    value = dict(good)
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(sorted(strange)) | NAMES)
        if key in value and draw(st.booleans()):
            del value[key]
        else:
            value[key] = draw(strange.get(key, NUMBERS | JSON))
    return value


@st.composite
def rows(draw) -> dict:
    row = {"Thing": draw(GOOD_THINGS), "Timestamp": draw(GOOD_TIMES), "id": draw(GOOD_NAMES | st.integers())}
    row.update(draw(st.dictionaries(GOOD_NAMES, GOOD_RESULTS, min_size=1, max_size=4)))
    return draw(spoiled(row, {"Thing": NAMES | JSON, "Timestamp": TIMES | JSON, "id": NAMES | NUMBERS | JSON}))


@st.composite
def records(draw) -> dict:
    def input_time() -> dict:
        return {"quantity": draw(GOOD_NAMES), "phenomenonTime": draw(VALID_MS), "result": draw(GOOD_RESULTS)}

    record = {"thing": draw(GOOD_THINGS), "quantity": draw(GOOD_NAMES), "phenomenonTime": draw(VALID_MS),
              "result": draw(GOOD_RESULTS), "case": draw(GOOD_NAMES), "left": input_time(), "right": input_time()}
    strange_input = st.fixed_dictionaries({"phenomenonTime": TIMES | JSON}) | JSON
    return draw(spoiled(record, {
        "thing": NAMES | JSON, "quantity": NAMES | JSON, "phenomenonTime": TIMES | JSON,
        "result": NUMBERS | JSON, "case": NAMES | JSON, "left": strange_input, "right": strange_input,
        "id": JSON}))


ROWS = rows()
RECORDS = records()
NESTED = st.integers(1, 5000).map(lambda depth: b"[" * depth + b"]" * depth)


def payloads(values) -> st.SearchStrategy[bytes]:
    as_json = json_bytes(values)
    return st.one_of(as_json, as_json, as_json, broken(as_json), st.binary(max_size=200), NESTED)


# --- what each stage must make of it ---------------------------------------------------------------

def assert_dead_letter(letter: bytes, payload: bytes) -> None:
    """A dead letter is ASCII JSON with a reason and the payload as it came; it counts in InfluxDB."""
    assert letter.isascii()
    envelope = json.loads(letter)
    assert envelope["reason"]
    kept = envelope["payload"].encode() if "payload" in envelope else base64.b64decode(envelope["payloadBase64"])
    assert kept == payload
    count = deadletter_point("deadletters", letter, 1_700_000_000_000, 0, 0)
    assert "\n" not in count and body([count])


def through_the_stream_connector(payload: bytes) -> None:
    split = split_row(payload, MAX_ROW_BYTES, MAX_QUANTITIES)
    assert split.records or split.rejections
    for value, key, partition in kafka_messages(split.records, PARTITIONS):
        record = decode_record(value)  # what every later stage reads back
        assert key == record_key(record["thing"], record["quantity"]).encode("utf-8")
        assert partition == thing_partition(record["thing"], PARTITIONS)
        assert EARLIEST_MS <= record["phenomenonTime"] < LATEST_MS
    if split.rejections:
        assert_dead_letter(dead_letter("; ".join(split.rejections), payload, "stream_connector", mqttTopic="t",
                                       rejectedQuantities=split.rejected_quantities or None), payload)


def through_the_joiners_decode(payload: bytes) -> None:
    try:
        record = decode_record(payload)
    except InvalidRecord as error:
        assert_dead_letter(dead_letter(str(error), payload, "kafka_joiner", topic="t", partition=0, offset=0),
                           payload)
        return
    record_key(record["thing"], record["quantity"]).encode()  # the Kafka joiner's key check
    thing_partition(record["thing"], PARTITIONS)  # ... and its partition check
    pa.array([record["thing"], record["quantity"]], pa.string())  # the Spark joiner's columns
    np.array([record["phenomenonTime"], record["result"]], np.float64)
    assert EARLIEST_MS <= record["phenomenonTime"] < LATEST_MS


def through_the_db_connector(payload: bytes) -> None:
    for measurement, levels in (("machinedata", None), ("joined", LEVELS)):
        try:
            line = record_line(payload, measurement, levels)
        except InvalidRecord as error:
            assert_dead_letter(dead_letter(str(error), payload, "db_connector", topic="t", partition=0, offset=0),
                               payload)
            continue
        assert "\n" not in line and "\r" not in line and body([line])
        series, fields, time_ns = line.rsplit(" ", 2)
        assert fields.startswith("result=") and int(time_ns) > 0
    assert body([deadletter_point("deadletters", payload, 1_700_000_000_000, 0, 0)])


# --- the properties ------------------------------------------------------------------------------

@EXAMPLES
@given(payloads(ROWS) | payloads(JSON))
def test_any_row_becomes_records_or_a_dead_letter(payload: bytes) -> None:
    through_the_stream_connector(payload)


@EXAMPLES
@given(payloads(RECORDS) | payloads(JSON))
def test_any_record_is_read_by_the_joiners_or_dead_lettered(payload: bytes) -> None:
    through_the_joiners_decode(payload)


@EXAMPLES
@given(payloads(RECORDS) | payloads(JSON))
def test_any_record_becomes_a_point_or_a_dead_letter(payload: bytes) -> None:
    through_the_db_connector(payload)


@EXAMPLES
@given(payloads(ROWS))
def test_whatever_the_connector_writes_every_later_stage_reads(payload: bytes) -> None:
    split = split_row(payload, MAX_ROW_BYTES, MAX_QUANTITIES)
    for value, _key, _partition in kafka_messages(split.records, PARTITIONS):
        through_the_joiners_decode(value)
        assert record_line(value, "machinedata")


FRAMED_RECORDS = st.lists(st.builds(
    FramedRecord, st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1),
    st.none() | st.binary(max_size=40), st.none() | st.binary(max_size=200)), max_size=20)


@EXAMPLES
@given(FRAMED_RECORDS)
def test_a_frame_gives_back_the_records_framed(records: list[FramedRecord]) -> None:
    assert decode_frame(encode_frame(records)) == records


@EXAMPLES
@given(st.binary(max_size=300) | FRAMED_RECORDS.map(encode_frame).map(lambda frame: frame[:-1]))
def test_any_message_on_the_repartition_topic_is_read_or_dead_lettered(message: bytes) -> None:
    for framed in frame_records(message, 3, 7, b"key"):
        assert isinstance(framed, FramedRecord)
        through_the_joiners_decode(framed.value)


def test_known_poison_inputs() -> None:
    """The inputs that stopped a stage before, kept as examples beside the search."""
    for payload in (b'{"Thing": "\\ud800", "Timestamp": 1554096460415, "q": 1}',
                    b'{"Thing": "\xed\xa0\x80", "Timestamp": 1554096460415, "q": 1}',
                    b'{"Thing": "M", "Timestamp": 1554096460415, "\\ud800": 1}',
                    b'{"Thing": "M", "Timestamp": 1e20, "q": 1}',
                    b'{"Thing": "M", "Timestamp": 1554096460415, "": 1}',
                    b'{"Thing": "M", "Timestamp": 1554096460415, "q": 1, "id": "\\udfff"}',
                    b"[" * 100_000 + b"]" * 100_000):
        through_the_stream_connector(payload)
    for payload in (b'{"thing": "\\ud800", "quantity": "q", "phenomenonTime": 1554096460415, "result": 1}',
                    b'{"thing": "R", "quantity": "q", "phenomenonTime": 1554096460415, "result": 1, '
                    b'"case": "\\ud800", "left": {"phenomenonTime": 1554096460415}, '
                    b'"right": {"phenomenonTime": 1554096460415}}',
                    b'{"thing": "R", "quantity": "q", "phenomenonTime": 1554096460415, "result": 1, "case": "c", '
                    b'"left": {"phenomenonTime": 1e308}, "right": {"phenomenonTime": -1e308}}',
                    b'{"reason": "\\ud800", "stage": "\\ud800"}'):
        through_the_joiners_decode(payload)
        through_the_db_connector(payload)
