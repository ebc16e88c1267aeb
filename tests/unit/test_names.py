"""Any name (`names_support.names`: dots, backslashes, control, separator, format, private-use characters...)
through every place a stage encodes or decodes one: the Kafka key (built and taken apart), the stream
connector's row split, both joiners' admission (the standalone joiner's routing and key check, the Spark
joiner's column-wise key check and routing) and output keys, the DB connector's line protocol, and the MQTT
topic the simulator gives a row, the dashboards' series labels and `make report`'s drawing. Each comes back
exactly; only what is no name is refused."""
from __future__ import annotations

import json
import re

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from db_connector.points import PowerLevels, data_point, joined_point
from grafana_report.dashboards import DASHBOARDS_DIR, load_dashboards
from grafana_report.macros import TimeRange, alias
from grafana_report.panels import Series
from grafana_report.render import draw_panel, plt
from joiner_doubles import (PARTITIONS, RESOLVER, consumed, spark_joiner_records, standalone_joiner_repartitioned,
                            standalone_joiner_where_it_lies)
from kafka_joiner.repartition import ThingRouter
from names_support import MAX_NAME_LENGTH, PLANT_NAMES, names
from pipeline_core.admission import key_text, refusal, skips, wrong_key
from pipeline_core.influx import shown_name, stored_name
from pipeline_core.partitioning import thing_partition
from pipeline_core.record_columns import decode_record_columns, key_column
from pipeline_core.record_keys import record_key, split_key
from pipeline_core.records import InvalidRecord, decode_record, encode_record
from pipeline_core.validation import name_problem
from simulator.topics import fits_a_level, row_topic
from spark_support import routed_rows
from stream_connector.rows import kafka_messages, split_row

EXAMPLES = settings(max_examples=300, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BATCHES = settings(max_examples=40, deadline=None, derandomize=True,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
T_MS = 1_554_096_460_415
LEVELS = PowerLevels.parse("100,1000,5000")


# --- the key --------------------------------------------------------------------------------------

@EXAMPLES
@given(names(), names())
def test_a_key_gives_back_its_thing_and_quantity(thing: str, quantity: str) -> None:
    assert split_key(record_key(thing, quantity)) == (thing, quantity)


@EXAMPLES
@given(names().filter(lambda name: "." not in name and "\\" not in name), names())
def test_the_key_of_a_thing_without_dot_and_backslash_is_what_it_always_was(thing: str, quantity: str) -> None:
    """Records already in machine.data keep their meaning, and every thing the pipeline took before keeps its keys."""
    assert record_key(thing, quantity).encode() == f"{thing}.{quantity}".encode()


@EXAMPLES
@given(st.text())
def test_text_is_one_key_or_no_key(text: str) -> None:
    """A key has one meaning: any text names one thing and quantity whose key it is, or nothing."""
    parts = split_key(text)
    assert parts is None or record_key(*parts) == text


@pytest.mark.parametrize("first, second", [(("a.b", "c"), ("a", "b.c")), (("a\\", "b"), ("a", "\\b")),
                                           (("a\\.b", "c"), ("a\\", "b.c"))])
def test_names_that_once_shared_a_key_have_keys_of_their_own(first: tuple[str, str], second: tuple[str, str]) -> None:
    assert record_key(*first) != record_key(*second)
    assert split_key(record_key(*first)) == first and split_key(record_key(*second)) == second


@pytest.mark.parametrize("text", ["R0815", "a\\b.c", "a\\", "\\", "a\\\\\\.b"])
def test_text_that_is_no_key_names_nothing(text: str) -> None:
    assert split_key(text) is None and key_text(text.encode()) is None


# --- the stream connector ---------------------------------------------------------------------------

@EXAMPLES
@given(names(), st.dictionaries(names().filter(lambda name: name not in ("Thing", "Timestamp", "id")),
                                st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=5))
def test_a_row_of_any_names_becomes_records_under_their_own_keys(thing: str, quantities: dict[str, float]) -> None:
    result = split_row(json.dumps({"Thing": thing, "Timestamp": T_MS, **quantities}).encode(), 1 << 20)
    assert result.rejections == []
    assert [(record["thing"], record["quantity"]) for record in result.records] == [(thing, q) for q in quantities]
    for (value, key, partition), record in zip(kafka_messages(result.records, 5), result.records):
        assert split_key(key.decode()) == (thing, record["quantity"])
        assert partition == thing_partition(thing, 5)
        assert decode_record(value) == record


@pytest.mark.parametrize("thing, reason", [("", "must be a non-empty string"), ("\ud800", "is no text"),
                                           ("P\udfffress", "is no text"), ("P" * (MAX_NAME_LENGTH + 1), "longer than")])
def test_only_what_is_no_name_is_dead_lettered(thing: str, reason: str) -> None:
    result = split_row(json.dumps({"Thing": thing, "Timestamp": T_MS, "q": 1.0}).encode(), 1 << 20)
    assert result.records == [] and reason in result.rejections[0] and result.rejections[0].isascii()


@EXAMPLES
@given(names())
def test_every_name_is_one(name: str) -> None:
    assert name_problem(name) is None


# --- the joiners ----------------------------------------------------------------------------------

@EXAMPLES
@given(names(), st.sampled_from(["actSpeed_C11", "vaTorque_C2", "temperature", "actSpeed_C11.x", "a.vaTorque_C3"]))
def test_both_joiners_admit_a_record_of_any_thing_under_its_own_key(thing: str, quantity: str) -> None:
    key = record_key(thing, quantity).encode()
    record = {"thing": thing, "quantity": quantity, "phenomenonTime": T_MS, "result": 1.0}
    joined = bool(re.fullmatch(r"(actSpeed|vaTorque)_C\d+", quantity))
    assert skips(key, RESOLVER.joinable_thing) is not joined
    assert RESOLVER.joinable_thing(key.decode()) == (thing if joined else None)
    partition = thing_partition(thing, PARTITIONS)
    assert ThingRouter(RESOLVER, PARTITIONS).partition(key) == (partition if joined else None)
    assert refusal(key, record, partition, PARTITIONS) is None
    # The key of the same names as it was built before names could hold dots and backslashes: another series's.
    former = f"{thing}.{quantity}".encode()
    assert (wrong_key(former, record) is None) is (former == key)


@BATCHES
@given(st.lists(st.tuples(names(max_size=40), st.sampled_from(["actSpeed_C11", "vaTorque_C11", "temperature"]),
                          st.integers(0, 30)), min_size=1, max_size=40))
def test_the_spark_router_reads_records_of_any_names_under_their_own_keys(drawn: list[tuple[str, str, int]]) -> None:
    records = [{"thing": thing, "quantity": quantity, "phenomenonTime": T_MS + 10 * tick, "result": 1.0}
               for thing, quantity, tick in drawn]
    routed = routed_rows(records)
    assert routed.column("reason").null_count == len(routed)  # none rejected
    joinable = [(r["thing"], r["quantity"]) for r in records if r["quantity"] != "temperature"]
    assert sorted(zip(routed.column("thing").to_pylist(), routed.column("quantity").to_pylist())) == sorted(joinable)


@BATCHES
@given(st.lists(names(max_size=30), min_size=1, max_size=4, unique=True), st.data())
def test_both_joiners_join_machines_of_any_names_alike_under_their_keys(things: list[str], data) -> None:
    records = []
    for thing in things:
        for quantity in ("actSpeed_C11", "vaTorque_C11"):
            for tick in sorted(data.draw(st.sets(st.integers(0, 8), min_size=1, max_size=5))):  # pairs within 1 s
                record = {"thing": thing, "quantity": quantity, "phenomenonTime": T_MS + 100 * tick, "result": 2.0}
                records.append((record_key(thing, quantity).encode(), encode_record(record), None,
                                thing_partition(thing, PARTITIONS)))
    messages = consumed(records)
    spark_outputs, spark_letters = spark_joiner_records(messages)
    assert spark_letters == [] and spark_outputs
    for standalone in (standalone_joiner_where_it_lies(messages), standalone_joiner_repartitioned(messages)):
        assert sorted(standalone.on("machine.out")) == sorted(spark_outputs)
        for topic, value, key in standalone.records:
            assert topic == "machine.out"
            output = json.loads(value)
            key = key.decode() if isinstance(key, bytes) else key
            assert split_key(key) == (output["thing"], output["quantity"]) and output["thing"] in things


# --- the DB connector -----------------------------------------------------------------------------

def tag_values(line: str) -> dict[str, str]:
    """The tags of a line as InfluxDB 1.x reads them (measured with influxd 1.6): a tag ends at a comma or space
    not preceded by a backslash; in its value, a backslash before a comma, space or equals sign is dropped, and
    every other backslash is kept."""
    assert "\n" not in line
    tags: dict[str, str] = {}
    position = line.index(",") + 1  # after the measurement (the tests' has no comma)
    while True:
        end = position
        while not (line[end] in ", " and line[end - 1] != "\\"):
            end += 1
        key, value = line[position:end].split("=", 1)
        tags[key] = re.sub(r"\\([, =])", r"\1", value)
        if line[end] == " ":
            return tags
        position = end + 1


@EXAMPLES
@given(names(), names())
def test_a_point_carries_any_names_as_tags_read_back_exactly(thing: str, quantity: str) -> None:
    record = {"thing": thing, "quantity": quantity, "phenomenonTime": T_MS, "result": 1.5}
    tags = tag_values(data_point("machinedata", decode_record(encode_record(record))))
    assert (shown_name(tags["thing"]), shown_name(tags["quantity"])) == (thing, quantity)
    joined = {**record, "case": "same_time", "left": {"quantity": "a", "phenomenonTime": T_MS, "result": 1.0},
              "right": {"quantity": "b", "phenomenonTime": T_MS, "result": 1.5}}
    tags = tag_values(joined_point("joined", decode_record(encode_record(joined)), LEVELS))
    assert (shown_name(tags["thing"]), shown_name(tags["quantity"]), tags["case"]) == (thing, quantity, "same_time")


@EXAMPLES
@given(names())
def test_a_name_is_stored_as_it_is_wherever_influxdb_can_carry_it(name: str) -> None:
    """The escape applies only to what InfluxDB cannot take and give back (NUL, line feed, carriage return, a
    backslash at the end) and to names starting with the escape's mark, a backslash and a double quote."""
    carried = not re.search(r'[\x00\n\r]', name) and not name.endswith("\\") and not name.startswith('\\"')
    assert (stored_name(name) == name) is carried
    assert shown_name(stored_name(name)) == name


def test_a_tag_value_no_stage_wrote_is_shown_as_it_is() -> None:
    foreign = ['\\"unterminated', '\\"1" and more', "plain", '\\"a\\q"', "\\R0815"]
    assert [shown_name(value) for value in foreign] == foreign


# --- the simulator's topics -------------------------------------------------------------------------

# What Mosquitto 2.0 refuses in a topic, from its `mosquitto_validate_utf8` (and confirmed with the real broker by
# tests/integration/test_names_end_to_end.py): these code points, and a topic level holds no / + #.
def mosquitto_refuses(code_point: int) -> bool:
    return (code_point <= 0x1F or 0x7F <= code_point <= 0x9F or 0xFDD0 <= code_point <= 0xFDEF
            or code_point & 0xFFFE == 0xFFFE or 0xD800 <= code_point <= 0xDFFF)


@EXAMPLES
@given(names())
def test_a_thing_is_its_topic_level_exactly_when_the_broker_takes_it(thing: str) -> None:
    fits = (not any(mosquitto_refuses(ord(char)) for char in thing) and not set("/+#") & set(thing)
            and not thing.startswith("$"))
    assert fits_a_level(thing) is fits
    assert row_topic("machine/states/{thing}")({"Thing": thing}) == ("machine/states/" + thing if fits
                                                                     else "machine/states")


@pytest.mark.parametrize("thing", PLANT_NAMES)
def test_plant_names_are_names_and_keys_of_their_own(thing: str) -> None:
    assert name_problem(thing) is None
    assert split_key(record_key(thing, "actSpeed_C11")) == (thing, "actSpeed_C11")
    assert RESOLVER.joinable_thing(record_key(thing, "vaTorque_C11")) == thing


def test_a_record_under_the_key_of_the_former_format_of_a_dotted_thing_is_refused() -> None:
    record = {"thing": "Plant1.Hall2", "quantity": "actSpeed_C11", "phenomenonTime": T_MS, "result": 1.0}
    reason = wrong_key(b"Plant1.Hall2.actSpeed_C11", record)
    assert reason is not None and "Plant1\\\\.Hall2.actSpeed_C11" in reason
    with pytest.raises(InvalidRecord, match="is no text"):
        decode_record(b'{"thing":"\\ud800","quantity":"q","phenomenonTime":1554096460415,"result":1}')


@BATCHES
@given(st.lists(st.tuples(names(max_size=20), names(max_size=20)), min_size=1, max_size=30))
def test_the_column_decoder_reads_any_names_as_the_record_decoder_does(pairs: list[tuple[str, str]]) -> None:
    payloads = [encode_record({"thing": thing, "quantity": quantity, "phenomenonTime": T_MS, "result": 1.0})
                for thing, quantity in pairs]
    columns = decode_record_columns(pa.array(payloads, pa.binary()))
    assert list(zip(columns.thing.to_pylist(), columns.quantity.to_pylist())) == pairs
    assert key_column(columns.thing, columns.quantity).to_pylist() == [record_key(*pair).encode() for pair in pairs]


# --- the dashboards and `make report` ---------------------------------------------------------------

@EXAMPLES
@given(names(), names())
def test_a_series_label_shows_any_names_exactly(thing: str, quantity: str) -> None:
    tags = {"thing": stored_name(thing), "quantity": stored_name(quantity)}
    assert alias("$tag_thing $tag_quantity", "joined", tags) == f"{thing} {quantity}"
    assert alias("$tag_thing", "joined", tags) == thing


def test_the_report_draws_names_matplotlib_would_read_as_math_or_leave_out_as_they_are() -> None:
    dashboard = next(d for d in load_dashboards(DASHBOARDS_DIR) if d.title == "Machine power and load")
    panel = next(p for p in dashboard.panels if p.type == "timeseries")
    labels = ["$\\frac$ vaPower_C11", "_R1 vaPower_C11", "a$b$ vaPower_C11", "Press\t5\n vaPower_C11"]
    series = [Series(label, [T_MS, T_MS + 1000], [1.0, 2.0]) for label in labels]
    figure, (ax, legend_ax) = plt.subplots(1, 2, figsize=(16, 4))
    try:
        draw_panel(ax, panel, series, TimeRange(T_MS - 60_000, T_MS + 60_000), 1000, legend_ax)
        figure.canvas.draw()  # what failed: the math parser, at drawing
        # The legend's rows (a header, then a row per series: its label, then its values), as drawn.
        rows = [text._preprocess_math(text.get_text())[0] for text in legend_ax.texts]
        assert [next((label for label in labels if row.startswith(label)), None) for row in rows[1:]] == labels
    finally:
        plt.close(figure)
