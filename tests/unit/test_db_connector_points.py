"""The DB connector's line protocol: floats always, safe escaping, and one point per distinct record."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from db_connector.points import (NS_PER_MS, PowerLevels, data_point, deadletter_point, epoch_ms_to_ns,
                                 joined_point, record_line)
from local_stream_buffer.keyed import KeyedJoiner
from pipeline_core.records import InvalidRecord

LEVELS = PowerLevels.parse("100,1000,5000")
T0 = 1554096460000


def raw(result: object = 1.5, thing: str = "R0815", quantity: str = "vaTorque_C11", time_ms: object = T0) -> dict:
    return {"thing": thing, "quantity": quantity, "phenomenonTime": time_ms, "result": result}


def joined(left_ms: float, right_ms: float, result: float = 50.0, case: str = "left_successor") -> dict:
    return {"thing": "R0815", "quantity": "vaPower_C11", "phenomenonTime": (left_ms + right_ms) / 2,
            "result": result, "case": case,
            "left": {"quantity": "actSpeed_C11", "phenomenonTime": left_ms, "result": 1.0},
            "right": {"quantity": "vaTorque_C11", "phenomenonTime": right_ms, "result": 2.0}}


def data_line(record: dict) -> str:
    """The line of `record` as the connector makes it from a machine.data payload (decoded and checked first)."""
    return record_line(json.dumps(record).encode(), "m")


def series_and_time(line: str) -> tuple[str, int]:
    series, _fields, time_ns = line.rsplit(" ", 2)
    return series, int(time_ns)


def test_integer_result_is_written_as_float() -> None:
    assert data_point("machinedata", raw(3)) == \
        f"machinedata,quantity=vaTorque_C11,thing=R0815 result=3.0 {T0 * NS_PER_MS}"


@pytest.mark.parametrize("value", [1e20, -1.5e-3, 0.1])
def test_float_results_round_trip(value: float) -> None:
    assert float(data_point("m", raw(value)).split("result=")[1].split(" ")[0]) == value


@pytest.mark.parametrize("value", ["12", None, True, math.nan, math.inf, [1.0]])
def test_non_numeric_results_are_refused(value: object) -> None:
    with pytest.raises(InvalidRecord, match="result"):
        data_line(raw(value))


def test_tag_values_are_escaped() -> None:
    line = data_point("my measurement", raw(thing="R 0,8=15"))
    assert line.startswith(r"my\ measurement,quantity=vaTorque_C11,thing=R\ 0\,8\=15 result=1.5 ")


@pytest.mark.parametrize("thing, tag", [("R08\n15", r'\"R08\n15"'), ("R0815\\", r'\"R0815\\"'),
                                        ("R08\r15", r'\"R08\r15"'), ("R08\x0015", r'\"R08\u000015"'),
                                        ('\\"R0815"', r'\"\\\"R0815\""'), ("R08\t15", "R08\t15"),
                                        ("a\\b", "a\\b"), ("\\R0815", "\\R0815")])
def test_names_influxdb_cannot_carry_as_they_are_are_escaped_the_others_not(thing: str, tag: str) -> None:
    series, _time_ns = series_and_time(data_line(raw(thing=thing)))
    assert series == f"m,quantity=vaTorque_C11,thing={tag}"


def test_times_outside_influxdbs_range_are_refused() -> None:
    with pytest.raises(InvalidRecord, match="time range"):
        data_line(raw(time_ms=1e20))


def test_fractional_milliseconds_are_exact() -> None:
    assert epoch_ms_to_ns(T0 + 0.5) == T0 * NS_PER_MS + 500_000
    assert epoch_ms_to_ns(T0) == T0 * NS_PER_MS


def test_join_results_with_the_same_mean_time_do_not_overwrite_each_other() -> None:
    # (1, 3) and (2, 2) share thing, quantity and mean time 2, and here even case and level.
    first = series_and_time(joined_point("joined", joined(T0 + 1, T0 + 3), LEVELS))
    second = series_and_time(joined_point("joined", joined(T0 + 2, T0 + 2), LEVELS))
    assert first[0] == second[0]
    assert first[1] != second[1]
    # Both stay inside the millisecond of the mean time.
    assert first[1] // NS_PER_MS == second[1] // NS_PER_MS == T0 + 2


def test_a_replayed_join_result_lands_on_the_same_point() -> None:
    assert joined_point("joined", joined(T0, T0 + 7), LEVELS) == joined_point("joined", joined(T0, T0 + 7), LEVELS)


def test_join_result_tags_and_fields() -> None:
    line = joined_point("joined", joined(T0, T0 + 1, result=-2500.0, case="same_time"), LEVELS)
    assert line.startswith("joined,case=same_time,level=medium,quantity=vaPower_C11,thing=R0815 "
                           "result=-2500.0,active=1.0 ")
    assert ",active=0.0 " in joined_point("joined", joined(T0, T0, result=5), LEVELS)


def test_join_result_without_input_times_is_refused() -> None:
    record = joined(T0, T0)
    del record["left"]
    with pytest.raises(InvalidRecord, match="left.phenomenonTime"):
        joined_point("joined", record, LEVELS)


@pytest.mark.parametrize("value, level", [(0, "idle"), (-99.9, "idle"), (100, "low"), (999, "low"),
                                          (-4000, "medium"), (5000, "high"), (1e9, "high")])
def test_power_levels(value: float, level: str) -> None:
    assert LEVELS.level(value) == level


@pytest.mark.parametrize("text", ["1,2", "3,2,1", "a,b,c"])
def test_power_levels_must_be_three_ascending_numbers(text: str) -> None:
    with pytest.raises(ValueError):
        PowerLevels.parse(text)


@pytest.mark.parametrize("payload", [b'{"reason": "bad", "stage": "stream_connector"}', b"\xff\x00", None])
def test_every_dead_letter_counts(payload: bytes | None) -> None:
    line = deadletter_point("deadletters", payload, 1_700_000_000_000, 2, 42)
    assert line.endswith(f" {1_700_000_000_000 * NS_PER_MS + 42}")
    assert line.startswith("deadletters,partition=2,stage=")


def test_dead_letters_of_different_partitions_in_one_millisecond_are_different_points() -> None:
    lines = {deadletter_point("deadletters", b"{}", 1_700_000_000_000, partition, 0) for partition in range(3)}
    assert len({series_and_time(line) for line in lines}) == 3


times = st.lists(st.integers(0, 40), min_size=1, max_size=25, unique=True).map(sorted)


@settings(max_examples=300, deadline=None)
@given(times, times, st.booleans())
def test_different_join_results_never_share_series_and_time(left: list[int], right: list[int],
                                                            left_stream_first: bool) -> None:
    """Whatever the engine pairs, distinct results (distinct ids) land on distinct points."""
    records = [{"thing": "R0815", "quantity": "actSpeed_C11", "phenomenonTime": T0 + t * 250,
                "result": 1.0 + t} for t in left]
    records += [{"thing": "R0815", "quantity": "vaTorque_C11", "phenomenonTime": T0 + t * 250,
                 "result": 2.0 + t} for t in right]
    # Each stream in its own time order: one stream after the other, or interleaved by time.
    order = (lambda r: (r["quantity"], r["phenomenonTime"])) if left_stream_first else \
        (lambda r: r["phenomenonTime"])
    joiner = KeyedJoiner()
    results = [output for record in sorted(records, key=order) for output in joiner.ingest(record).outputs]
    points = {series_and_time(joined_point("joined", result, LEVELS)) for result in results}
    assert len(points) == len({result["id"] for result in results})
