"""The rules of partitions added to machine.data, alone: the placement header every record carries (the partition
counts its writer placed by), where a thing's earlier records lie, the admission rule's partition step by the count
a record names, the adopted records' keys in a changelog, and a clock record handed over with its thing."""
from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from kafka_joiner.changelog import _in_order, adopted_feeds, adopted_key, adopted_position, clock_key
from kafka_joiner.handover import moved_clock
from pipeline_core.admission import misplaced
from pipeline_core.partitioning import (PLACEMENT_HEADER, earlier_homes, placement_history, placement_value,
                                        thing_partition)

HISTORIES = st.lists(st.integers(1, 10_000), min_size=1, max_size=6).map(tuple)


@given(HISTORIES)
def test_a_history_reads_back_as_written(history: tuple[int, ...]) -> None:
    assert placement_history([("other", b"x"), (PLACEMENT_HEADER, placement_value(history))]) == history


@given(st.binary(max_size=40))
def test_any_header_value_reads_as_a_history_or_none(value: bytes) -> None:
    history = placement_history([(PLACEMENT_HEADER, value)])
    assert history is None or (history and all(count >= 1 for count in history))


def test_no_header_names_no_history() -> None:
    assert placement_history(None) is None and placement_history([]) is None
    assert placement_history([(PLACEMENT_HEADER, None)]) is None
    assert placement_history([(PLACEMENT_HEADER, b"5,x")]) is None and placement_history([(PLACEMENT_HEADER, b"0")]) is None


@given(st.text(min_size=1, max_size=12), HISTORIES)
def test_earlier_homes_are_where_earlier_counts_placed_the_thing(thing: str, history: tuple[int, ...]) -> None:
    homes = earlier_homes(thing, history)
    expected = []
    for count in reversed(history[:-1]):
        partition = thing_partition(thing, count)
        if partition != thing_partition(thing, history[-1]) and partition not in expected:
            expected.append(partition)
    assert homes == expected


def test_a_record_is_judged_by_the_count_it_was_placed_by() -> None:
    thing = next(t for t in (f"m{i}" for i in range(1000)) if thing_partition(t, 5) != thing_partition(t, 8))
    old, new = thing_partition(thing, 5), thing_partition(thing, 8)
    assert misplaced(thing, old, 8, placed_with=5) is None
    assert misplaced(thing, new, 8, placed_with=8) is None
    assert misplaced(thing, new, 8, placed_with=5) is not None  # says 5, lies where 8 puts it
    # A record that names no count: any count the joiner knows the topic to have had.
    assert misplaced(thing, old, (5, 8)) is None and misplaced(thing, new, (5, 8)) is None
    assert "belongs in partition" in misplaced(thing, old, 8)


def test_adopted_records_restore_just_before_their_things_first_record() -> None:
    values = {(300).to_bytes(8, "big"): (1, b"r300"), (100).to_bytes(8, "big"): (2, b"r100"),
              adopted_key(300, 1): (3, b"a1"), adopted_key(300, 0, frozenset({"f1"})): (4, b"a0"),
              b"junk": (5, b"j")}
    order = [record.value for record in _in_order(values)]
    assert order == [b"j", b"r100", b"a0", b"a1", b"r300"]
    assert adopted_feeds(adopted_key(300, 0, frozenset({"f1", "f2"}))) == {"f1", "f2"}
    assert adopted_feeds(adopted_key(300, 0)) is None


def test_a_clock_record_handed_over_names_its_records_by_their_places_where_they_are_adopted() -> None:
    snapshot = {"line": [0, 1], "votes": [3, 0], "aside": [[120], []],
                "left_lines": [{"0": [100, 110]}, {}]}
    key = clock_key("m1", "power", "11")
    places = {100: adopted_position(900, 0), 110: adopted_position(900, 1), 120: adopted_position(900, 2)}
    moved = json.loads(moved_clock(key, json.dumps(snapshot).encode(), places))
    assert moved["aside"] == [[adopted_position(900, 2)], []]
    assert moved["left_lines"] == [{"0": [adopted_position(900, 0), adopted_position(900, 1)]}, {}]
    assert moved["line"] == snapshot["line"] and moved["votes"] == snapshot["votes"]
    # The places are the ones a restore gives the adopted records (their keys name them).
    values = {adopted_key(900, index): (index, b"r") for index in range(3)}
    assert [record.position for record in _in_order(values)] == [adopted_position(900, i) for i in range(3)]
