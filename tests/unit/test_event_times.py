"""The one reading of event times (`pipeline_core.timestamps.event_time_ms`): units by magnitude,
ISO-8601, the valid range, and a reason for everything else, never a silent rescale."""
from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline_core.timestamps import EARLIEST_MS, LATEST_MS, InvalidTime, event_time_ms, shifted_time

T_MS = 1_554_096_460_415  # 2019-04-01T05:27:40.415Z


@pytest.mark.parametrize("value", [1554096460.415, 1554096460415, 1554096460415000, 1554096460415000000,
                                   1554096460415.0, 1.554096460415e18, "2019-04-01T05:27:40.415Z",
                                   "2019-04-01T05:27:40.415+00:00", "2019-04-01T07:27:40.415+02:00",
                                   "2019-04-01T05:27:40.415"])
def test_the_same_instant_in_every_unit_is_the_same_integer_millisecond(value):
    assert event_time_ms(value) == T_MS
    assert type(event_time_ms(value)) is int


def test_sub_millisecond_precision_is_kept_to_the_microsecond():
    assert event_time_ms(1554096460415123) == 1554096460415.123
    assert event_time_ms(1554096460415123456) == 1554096460415.123  # ns: to the nearest µs
    assert event_time_ms("2019-04-01T05:27:40.415123Z") == 1554096460415.123


@pytest.mark.parametrize("value, reason", [
    (1e20, "outside the valid time range"),  # once divided until it "looked like" ms: 2001
    (1e300, "outside the valid time range"),
    (10 ** 400, "outside the valid time range"),
    (0, "outside the valid time range"),
    (-T_MS, "outside the valid time range"),
    (946684799, "outside the valid time range"),  # 1999-12-31T23:59:59 in s
    (LATEST_MS, "outside the valid time range"),  # 2100-01-01 itself is excluded
    (123456789012, "outside the valid time range"),  # between the s and ms bands: no unit fits
    ("1999-12-31T23:59:59Z", "outside the valid time range"),
    ("2100-01-01T00:00:00Z", "outside the valid time range"),
    (math.nan, "not a finite time"),
    (math.inf, "not a finite time"),
    (-math.inf, "not a finite time"),
    ("yesterday", "not ISO-8601"),
    ("1554096460415", "not ISO-8601"),
    ("\ud800", "not ISO-8601"),
    ("2019-04-01T05:27:40" + " " * 100, "no ISO-8601 time"),
    (True, "expected a number"),
    (None, "expected a number"),
    ([T_MS], "expected a number"),
    ({"ms": T_MS}, "expected a number"),
])
def test_what_is_no_time_is_refused_with_the_reason(value, reason):
    with pytest.raises(InvalidTime, match=reason) as refused:
        event_time_ms(value)
    assert str(refused.value).isprintable()  # safe in any reason, whatever the value held


def test_the_range_ends_are_exact():
    assert event_time_ms(EARLIEST_MS) == EARLIEST_MS
    assert event_time_ms(LATEST_MS - 1) == LATEST_MS - 1
    assert event_time_ms(EARLIEST_MS // 1000) == EARLIEST_MS  # the first second, in s
    with pytest.raises(InvalidTime):
        event_time_ms(EARLIEST_MS - 1)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(st.characters(categories=["Cs"]))
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3), max_leaves=5)


@given(JSON_VALUES | st.integers(min_value=-(10 ** 30), max_value=10 ** 30)
       | st.floats(min_value=-1e25, max_value=1e25))
def test_any_value_is_a_time_in_the_range_or_refused(value):
    try:
        millis = event_time_ms(value)
    except InvalidTime:
        return
    assert EARLIEST_MS <= millis < LATEST_MS
    assert type(millis) is int or (type(millis) is float and not millis.is_integer())


@given(st.integers(EARLIEST_MS, LATEST_MS - 1))
def test_a_valid_millisecond_reads_back_from_every_unit(millis):
    assert event_time_ms(millis) == event_time_ms(millis * 1000) == event_time_ms(millis * 1_000_000) == millis
    assert event_time_ms(millis / 1000) == pytest.approx(millis, abs=1e-3)  # seconds as a float


@given(st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2099, 12, 31)),
       st.sampled_from([None, timezone.utc, timezone(timedelta(hours=2))]))
def test_iso_8601_times_are_exact(moment, zone):
    aware = moment.replace(tzinfo=zone or timezone.utc)
    expected = (aware - datetime(1970, 1, 1, tzinfo=timezone.utc)) / timedelta(milliseconds=1)
    if not EARLIEST_MS <= expected < LATEST_MS:  # an offset can push it over an end
        return
    assert event_time_ms(moment.replace(tzinfo=zone).isoformat()) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("value, shifted", [
    (T_MS, T_MS + 1000),
    (T_MS // 1000, T_MS // 1000 + 1),
    (1554096460.415, 1554096461.415),
    (1554096460415123, 1554096461415123),
    ("2019-04-01T05:27:40.415Z", "2019-04-01T05:27:41.415000+00:00"),
])
def test_a_shifted_time_keeps_its_unit(value, shifted):
    assert shifted_time(value, 1000) == shifted
    assert event_time_ms(shifted_time(value, 1000)) == pytest.approx(event_time_ms(value) + 1000)
