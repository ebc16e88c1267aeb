"""Whatever arrives, every stage's decode and encode path accepts it or dead-letters it with a
reason; none raises. Arbitrary bytes and arbitrary JSON (lone surrogates escaped and raw, control
characters, huge and non-finite numbers, deep nesting, odd time units, broken UTF-8) go through

* the stream connector: row -> records -> key, partition and value on machine.data, or a dead letter;
* `pipeline_core.records.decode_record` as both joiners read machine.data with it, and what they do
  with an accepted record (its key, its thing's partition, Arrow string columns);
* the DB connector: record -> line protocol, or a dead letter; and a dead letter -> its count point;
* whole Kafka records (key, value, headers; a null value is a tombstone) through each stage as it reads
  its topics: the standalone joiner's input frames, its repartition frames and its changelog restore, the
  Spark joiner's router (Arrow's JSON reader) and bucket join, and the DB connector's per-record step on
  all three of its topics. Each consumes every record and writes one dead letter, with its origin, per
  record that is none, and never raises;
* the corpus of bad records the start-from-nothing test writes (`poison_corpus`): every stage that reads
  it dead-letters each of its records.
"""
from __future__ import annotations

import base64
import json
import math
from datetime import datetime

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_joiner.changelog import CLOCK_PREFIX, RELEASE_PREFIX, StateRecord
from kafka_joiner.partition_join import PartitionJoin
from kafka_joiner.progress import JoinerStats
from kafka_joiner.repartition import (FRAME_MAX_BYTES, Forwarder, FramedRecord, InputFrames, ThingRouter, decode_frame,
                                      encode_frame, frame_records)
from db_connector.connector import Batch
from db_connector.influx_sink import InfluxSink
from db_connector.points import PowerLevels, body, deadletter_point, record_line
from db_connector.settings import DbConnectorSettings
from db_connector.sink import Source
from local_stream_buffer.keyed import KeyedJoiner
from local_stream_buffer.specs import JoinSpec, SpecResolver
from pipeline_core.partitioning import thing_partition
from pipeline_core.records import InvalidRecord, dead_letter, decode_record, record_key
from pipeline_core.settings import load_settings
from joiner_doubles import (DLQ_TOPIC, INPUT_TOPIC, OUTPUT_TOPIC, PARTITIONS, RESOLVER, STATE_TOPIC, KafkaRecord,
                            ProducedRecords, consumed, frame_joiner, routed, spark_joiner_letters,
                            standalone_joiner_repartitioned)
from poison_corpus import SPEED_KEY, poison_records
from pipeline_core.timestamps import EARLIEST_MS, LATEST_MS
from stream_connector.rows import kafka_messages, split_row

MAX_ROW_BYTES = 64 * 1024
MAX_QUANTITIES = 20
LEVELS = PowerLevels.parse("100,1000,5000")
EXAMPLES = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Whole batches of records through a joiner: fewer, larger examples.
BATCHES = settings(max_examples=60, deadline=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

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
    st.none() | st.binary(max_size=40), st.none() | st.binary(max_size=200), placement=st.none()), max_size=20)


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


# --- whole Kafka records through the joiners ------------------------------------------------------

HEADERS = st.none() | st.lists(st.tuples(STRANGE_TEXT, st.none() | st.binary(max_size=20)), max_size=3)
KEYS = st.one_of(st.none(), st.binary(max_size=30), STRANGE_TEXT.map(lambda text: text.encode("utf-8", "surrogatepass")),
                 st.sampled_from([SPEED_KEY, b"R0815.actSpeed_C11", b"R0815.vaTorque_C11", b"M1.vaTorque_C11", b""]))
VALUES = st.none() | payloads(RECORDS) | payloads(JSON)
# (key, value, headers, partition) of each record of a batch, in the order they are read.
KAFKA_RECORDS = st.lists(st.tuples(KEYS, VALUES, HEADERS, st.integers(0, PARTITIONS - 1)), min_size=1, max_size=25)


def is_record(value: bytes | None) -> bool:
    try:
        decode_record(value)
    except InvalidRecord:
        return False
    return True


def assert_letters_name_their_records(letters: list[bytes], bad: dict[tuple[int, int], bytes | None],
                                      stage: str, topic: str = INPUT_TOPIC) -> None:
    """One dead letter per bad record, naming its origin, with the reason and the payload as it came."""
    origins = []
    for letter in letters:
        envelope = json.loads(letter)
        assert envelope["stage"] == stage and envelope["topic"] == topic and envelope["reason"], envelope
        origin = (envelope["partition"], envelope["offset"])
        origins.append(origin)
        if origin in bad:
            payload = bad[origin]
            if payload is None:
                assert "payload" not in envelope and "payloadBase64" not in envelope
            else:
                assert_dead_letter(letter, payload)
    assert sorted(origins) == sorted(bad), (origins, sorted(bad))


@BATCHES
@given(KAFKA_RECORDS)
def test_any_input_record_is_joined_or_dead_lettered_by_the_standalone_joiner(records: list) -> None:
    """Input partitioned by thing (as the stack runs it): every record is a frame of its own. A record whose key
    no join needs is left alone; of the others, each that is no valid record where it lies is dead-lettered."""
    producer = ProducedRecords()
    messages = consumed(records)
    stats = JoinerStats()
    joiner, joins, _ = frame_joiner(producer, InputFrames(ThingRouter(RESOLVER, PARTITIONS), stats).frame)
    handled = 0
    while handled < len(messages):
        handled += joiner.join(messages[handled:], joins)
    bad = {(m.partition(), m.offset()): m.value() for m in messages if routed(m.key()) and not lies_where_it_joins(m)}
    assert_letters_name_their_records(producer.on(DLQ_TOPIC), bad, "kafka_joiner")
    assert stats.records_in == len(messages)


def has_own_key(message: KafkaRecord) -> bool:
    record = decode_record(message.value())
    return message.key() == record_key(record["thing"], record["quantity"]).encode()


def lies_where_it_joins(message: KafkaRecord) -> bool:
    """A valid record under its own key, in its thing's partition: what the standalone joiner joins."""
    try:
        record = decode_record(message.value())
    except InvalidRecord:
        return False
    return (message.key() == record_key(record["thing"], record["quantity"]).encode()
            and thing_partition(record["thing"], PARTITIONS) == message.partition())


@BATCHES
@given(KAFKA_RECORDS)
def test_any_input_record_passes_the_repartition_topic_or_is_dead_lettered(records: list) -> None:
    """Input partitioned by key: records are framed for their thing's partition, the frames read back from the
    repartition topic and joined. Whatever the key and value, what is no valid record is dead-lettered once."""
    messages = consumed(records)
    producer = standalone_joiner_repartitioned(messages)
    bad = {}
    for message in messages:
        if not routed(message.key()):
            continue
        try:
            record = decode_record(message.value())
            assert message.key() == record_key(record["thing"], record["quantity"]).encode()
        except (InvalidRecord, AssertionError):
            bad[(message.partition(), message.offset())] = message.value()
    assert_letters_name_their_records(producer.on(DLQ_TOPIC), bad, "kafka_joiner")


def partition_join(resolver: SpecResolver) -> PartitionJoin:
    """The join of partition 2, as the standalone joiner makes it."""
    return PartitionJoin(INPUT_TOPIC, 2, lambda on_release, on_evict, on_dead_letter: KeyedJoiner(
        resolver, on_release=on_release, on_evict=on_evict, on_dead_letter=on_dead_letter), None, None)


@BATCHES
@given(st.lists(st.tuples(st.none() | st.binary(max_size=12) | st.integers(0, 2**40).map(lambda p: p.to_bytes(8, "big")),
                          payloads(RECORDS) | st.binary(max_size=50)), max_size=20))
def test_any_changelog_record_is_restored_or_dead_lettered(held: list) -> None:
    """The state topic is a plain topic too: a record whose key is no position or whose value is no record is
    dropped on restore with a dead letter naming its place in the changelog, and a tombstone at the next
    commit; the others are restored, and the assignment goes on."""
    join = partition_join(RESOLVER)
    records = [StateRecord(int.from_bytes(key, "big") if key is not None and len(key) == 8 else None, key, offset, value)
               for offset, (key, value) in enumerate(held)]
    records.sort(key=lambda record: -1 if record.position is None else record.position)
    restored = join.restore(records, STATE_TOPIC)
    bad = {(2, record.offset): record.value for record in records
           if record.position is None or not is_record(record.value)}
    assert restored == len(records) - len(bad)
    assert_letters_name_their_records(join.dead_letters, bad, "kafka_joiner", STATE_TOPIC)
    tombstones = []
    join.changes.flush(lambda key, value: tombstones.append(key) if value is None else None)
    # Tombstones for the dropped records, and for restored records the join does not take (no join's quantity).
    held = set(join.joiner.held_sources())
    assert sorted(tombstones) == sorted(record.key for record in records if record.key is not None and (
        (2, record.offset) in bad or record.position not in held))


RELEASING = SpecResolver([JoinSpec("power", "actSpeed_C{axis}", "vaTorque_C{axis}", "vaPower_C{axis}", "power", 1.0,
                                   max_out_of_orderness_s=2.0, idle_release_s=30.0)])
RELEASE_KEYS = st.one_of(
    st.binary(max_size=40),
    st.lists(st.one_of(STRANGE_TEXT, st.sampled_from(["power", "11", ""]), st.integers(-2, 3), st.none(),
                       st.floats(allow_nan=True)), max_size=5).map(lambda items: json.dumps(items).encode()),
    st.builds(lambda thing, axis, side: json.dumps([thing, "power", axis, side]).encode(),
              STRANGE_TEXT, st.sampled_from(["11", "12", "x"]), st.integers(0, 1)),
    st.integers(1, 3).map(lambda depth: b"[" * 100_000 * depth),
)
def names_a_release(key: bytes, value: bytes) -> bool:
    """A release record's form, written out: [thing, spec, axis, side 0 or 1] as JSON after the prefix, a finite
    number as the value."""
    try:
        stream = json.loads(key[len(RELEASE_PREFIX):].decode("utf-8"))
        time_ms = float(value.decode("ascii"))
    except (ValueError, RecursionError):
        return False
    return (isinstance(stream, list) and len(stream) == 4 and all(isinstance(part, str) for part in stream[:3])
            and stream[3] in (0, 1) and type(stream[3]) is int and math.isfinite(time_ms))


RELEASE_VALUES = st.one_of(st.binary(max_size=12), st.floats(allow_nan=True).map(lambda f: repr(f).encode()),
                           st.integers(0, 2**60).map(lambda n: str(n).encode()))


@BATCHES
@given(st.lists(st.tuples(RELEASE_KEYS, RELEASE_VALUES), max_size=12))
def test_any_release_record_is_applied_or_dead_lettered(releases: list) -> None:
    """A changelog record keyed like a release record (an idle release's) that names no stream of a join key and
    a finite time is dropped on restore with a dead letter and a tombstone; the others are applied (or tombstoned
    when no spec of theirs releases any more), and the assignment goes on."""
    join = partition_join(RELEASING)
    records = [StateRecord(None, RELEASE_PREFIX + key, offset, value) for offset, (key, value) in enumerate(releases)]
    join.restore([], STATE_TOPIC, records)
    bad = {(2, record.offset): record.value for record in records if not names_a_release(record.key, record.value)}
    assert_letters_name_their_records(join.dead_letters, bad, "kafka_joiner", STATE_TOPIC)
    tombstones = []
    join.changes.flush(lambda key, value: tombstones.append(key) if value is None else None)
    assert {record.key for record in records if (2, record.offset) in bad} <= set(tombstones)


CLOCK_KEYS = st.one_of(
    st.binary(max_size=40),
    st.lists(st.one_of(STRANGE_TEXT, st.sampled_from(["power", "11"]), st.integers(-2, 3), st.none()), max_size=4).map(
        lambda items: json.dumps(items).encode()),
    st.builds(lambda thing, axis: json.dumps([thing, "power", axis]).encode(), STRANGE_TEXT, st.sampled_from(["11", "x"])),
    st.integers(1, 3).map(lambda depth: b"[" * 100_000 * depth),
)
SNAPSHOT_PARTS = st.one_of(st.integers(-2, 5), st.none(), STRANGE_TEXT, st.floats(allow_nan=True),
                           st.lists(st.integers(-1, 3), max_size=3))
CLOCK_VALUES = st.one_of(
    st.binary(max_size=30),
    st.fixed_dictionaries({"line": st.lists(SNAPSHOT_PARTS, max_size=3), "votes": st.lists(SNAPSHOT_PARTS, max_size=3),
                           "aside": st.lists(SNAPSHOT_PARTS, max_size=3),
                           "left_lines": st.lists(st.dictionaries(st.sampled_from(["0", "1", "x", "-1"]),
                                                                  SNAPSHOT_PARTS, max_size=2) | SNAPSHOT_PARTS,
                                                  max_size=3)}).map(lambda snapshot: json.dumps(snapshot).encode()),
    st.just(json.dumps({"line": [1, 0], "votes": [0, 0], "aside": [[], []], "left_lines": [{}, {}]}).encode()),
)


def names_a_clock(key: bytes, value: bytes) -> bool:
    """A clock record's form, written out: [thing, spec, axis] as JSON after the prefix; as the value, a snapshot
    of two sides' timelines and votes (whole numbers from 0), positions set aside, and positions per timeline left."""
    try:
        join_key = json.loads(key[len(CLOCK_PREFIX):].decode("utf-8"))
        snapshot = json.loads(value.decode("utf-8"))
    except (ValueError, RecursionError):
        return False
    if not (isinstance(join_key, list) and len(join_key) == 3 and all(isinstance(part, str) for part in join_key)):
        return False
    if not isinstance(snapshot, dict):
        return False
    parts = [snapshot.get(name) for name in ("line", "votes", "aside", "left_lines")]
    if not all(isinstance(part, list) and len(part) == 2 for part in parts):
        return False
    line, votes, aside, left_lines = parts
    whole = all(type(n) is int and n >= 0 for n in line + votes)
    positions = all(isinstance(side, list) and all(type(p) is int for p in side) for side in aside)
    lines = all(isinstance(held, dict) and all(number.isdigit() and isinstance(p, list) and
                                               all(type(n) is int for n in p) for number, p in held.items())
                for held in left_lines)
    return whole and positions and lines


@BATCHES
@given(st.lists(st.tuples(CLOCK_KEYS, CLOCK_VALUES), max_size=12))
def test_any_clock_record_is_applied_or_dead_lettered(clocks: list) -> None:
    """A changelog record keyed like a clock record (a join key's clock rule) that names no join key or holds no
    snapshot is dropped on restore with a dead letter and a tombstone; the others are applied (or tombstoned when
    their spec is gone), and the assignment goes on."""
    join = partition_join(RESOLVER)
    records = [StateRecord(None, CLOCK_PREFIX + key, offset, value) for offset, (key, value) in enumerate(clocks)]
    join.restore([], STATE_TOPIC, records)
    bad = {(2, record.offset): record.value for record in records if not names_a_clock(record.key, record.value)}
    assert_letters_name_their_records(join.dead_letters, bad, "kafka_joiner", STATE_TOPIC)
    tombstones = []
    join.changes.flush(lambda key, value: tombstones.append(key) if value is None else None)
    assert {record.key for record in records if (2, record.offset) in bad} <= set(tombstones)


@BATCHES
@given(KAFKA_RECORDS)
def test_any_input_record_is_joined_or_dead_lettered_by_the_spark_joiner(records: list) -> None:
    """The Spark joiner takes any partitioning: of the records whose key a join needs (or that name none), every
    one that is no valid record under its own key, a tombstone included, is dead-lettered once by its router,
    whichever path (Arrow's JSON reader or decode_record) judged it."""
    messages = consumed(records)
    bad = {(m.partition(), m.offset()): m.value() for m in messages
           if routed(m.key()) and not (is_record(m.value()) and has_own_key(m))}
    letters = [letter for letter in spark_joiner_letters(messages) if "partition" in json.loads(letter)]
    assert_letters_name_their_records(letters, bad, "spark_joiner")


def test_every_stage_dead_letters_every_record_of_the_poison_corpus() -> None:
    """The corpus the start-from-nothing test writes to machine.data and machine.out: each record is one dead
    letter of each stage that reads it (so that test can count them), and its keys reach the standalone
    joiner's join (a key no join needs is left to the DB connector's check)."""
    corpus = poison_records(100_000)
    messages = [KafkaRecord(INPUT_TOPIC, partition % PARTITIONS, offset, record.key, record.value, record.headers)
                for offset, (partition, record) in enumerate(enumerate(corpus))]
    for message, record in zip(messages, corpus):
        assert routed(message.key()), record.what
        assert not is_record(message.value()), record.what
        for measurement, levels in (("machinedata", None), ("joined", LEVELS)):
            with pytest.raises(InvalidRecord):
                record_line(message.value(), measurement, levels)
    everything = {(m.partition(), m.offset()): m.value() for m in messages}
    assert_letters_name_their_records(spark_joiner_letters(messages), everything, "spark_joiner")
    stats = JoinerStats()
    producer = ProducedRecords()
    joiner, joins, _ = frame_joiner(producer, InputFrames(ThingRouter(RESOLVER, PARTITIONS), stats).frame)
    assert joiner.join(messages, joins) == len(messages)
    assert_letters_name_their_records(producer.on(DLQ_TOPIC), everything, "kafka_joiner")


@BATCHES
@given(st.lists(st.tuples(st.sampled_from([INPUT_TOPIC, OUTPUT_TOPIC, DLQ_TOPIC]), KEYS, VALUES, HEADERS),
                min_size=1, max_size=25))
def test_any_record_of_any_topic_becomes_a_point_or_a_dead_letter_of_the_db_connector(records: list) -> None:
    """The DB connector's own per-record step (`Batch.add` into the InfluxDB sink, whose client it never uses): a
    record of machine.data or machine.out that is no valid record is one dead letter naming its origin; every
    record of machine.dlq, readable or not, one count point; nothing raises."""
    sink = InfluxSink.from_settings(load_settings(DbConnectorSettings, []))
    sources = {INPUT_TOPIC: Source.DATA, OUTPUT_TOPIC: Source.JOINED, DLQ_TOPIC: Source.DEAD_LETTER}
    batch = Batch()
    messages = [KafkaRecord(topic, 0, offset, key, value, headers)
                for offset, (topic, key, value, headers) in enumerate(records)]
    batch.add(messages, sources, sink)
    lines = [line for line, _policy in batch.items]
    for topic, levels in ((INPUT_TOPIC, None), (OUTPUT_TOPIC, LEVELS)):
        bad = {(0, m.offset()): m.value() for m in messages if m.topic() == topic and not makes_a_line(m.value(), levels)}
        letters = [letter for letter in batch.dead_letters if json.loads(letter)["topic"] == topic]
        assert_letters_name_their_records(letters, bad, "db_connector", topic)
    assert len(batch.items) + len(batch.dead_letters) == len(messages) == len(batch)
    assert sum(line.startswith("deadletters,") for line in lines) == sum(m.topic() == DLQ_TOPIC for m in messages)
    assert all("\n" not in line for line in lines)


def makes_a_line(value: bytes | None, levels: PowerLevels | None) -> bool:
    try:
        record_line(value, "m", levels)
    except InvalidRecord:
        return False
    return True


def test_frames_close_at_their_bound_whatever_the_records_size() -> None:
    """Records as large as the input topic allows: the repartition hop frames them so that no frame is larger
    than one record plus FRAME_MAX_BYTES, and every record comes back out, in order."""
    big = b'{"thing": "R0815", "pad": "' + b"x" * 400_000 + b'"}'
    records = [(b"R0815.actSpeed_C11", big if offset % 3 else b"{}", None, 0) for offset in range(12)]
    forwarder = Forwarder(INPUT_TOPIC, ThingRouter(RESOLVER, PARTITIONS), JoinerStats())
    forwarder.forward(consumed(records))
    frames: list[bytes] = []
    forwarder.flush(lambda partition, frame: frames.append(frame))
    assert len(frames) > 1 and all(len(frame) <= FRAME_MAX_BYTES + len(big) + 100 for frame in frames)
    framed = [record for frame in frames for record in decode_frame(frame)]
    assert [(record.offset, record.value) for record in framed] == [
        (offset, value) for offset, (_key, value, _headers, _partition) in enumerate(records)]
