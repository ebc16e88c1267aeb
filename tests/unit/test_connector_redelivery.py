"""The connector's memory of records Kafka confirmed lately, against which a row sent again is checked."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from stream_connector.redelivery import WrittenRecords


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
