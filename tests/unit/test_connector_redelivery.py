"""The connector's memory of records Kafka confirmed lately, against which a row sent again is checked."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pipeline_core.records import dead_letter
from stream_connector.redelivery import WrittenRecords, dead_letter_key, rejected_row_key


def test_holds_what_was_added_and_forgets_the_oldest_beyond_its_capacity():
    written = WrittenRecords(capacity=3)
    for value in (b"a", b"b", b"c", b"d"):
        written.add(value)
    assert b"a" not in written
    assert all(value in written for value in (b"b", b"c", b"d"))
    assert len(written) == 3


@given(st.lists(st.binary(max_size=4), max_size=200, unique=True), st.integers(min_value=1, max_value=50))
def test_holds_exactly_the_last_values_confirmed(values, capacity):
    """Kafka confirms each record once, so the values come distinct."""
    written = WrittenRecords(capacity)
    for value in values:
        written.add(value)
    assert {value for value in values if value in written} == set(values[-capacity:])
    assert len(written) == min(capacity, len(values))


@given(st.text(min_size=1, max_size=20), st.binary(max_size=300), st.text(max_size=50))
def test_a_dead_letter_names_the_row_it_holds(mqtt_topic, payload, reason):
    """What the connector reads back from machine.dlq at start identifies a row as it does at run time,
    UTF-8 payloads and binary (base64) alike."""
    letter = dead_letter(reason, payload, "stream_connector", mqttTopic=mqtt_topic)
    assert dead_letter_key("stream_connector", letter) == rejected_row_key(mqtt_topic, payload)
    assert dead_letter_key("db_connector", letter) is None  # another stage's letters are not rows of ours


@given(st.binary(max_size=200))
def test_any_message_of_the_dlq_is_read_or_skipped(letter):
    assert dead_letter_key("stream_connector", letter) is None or len(dead_letter_key("stream_connector", letter)) == 20
