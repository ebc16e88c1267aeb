"""The topic filters of a connector instance, and the topic a simulated machine publishes on."""
from __future__ import annotations

import re

import pytest

from simulator.topics import row_topic
from stream_connector.filters import FilterError, covers, overlap, parse_filters


def test_the_default_filter_takes_every_device_topic():
    assert parse_filters("machine/states/#") == ["machine/states/#"]


def test_filters_are_comma_separated_and_stripped():
    assert parse_filters("machine/states/R0815, machine/states/+/hall-2/#") == [
        "machine/states/R0815", "machine/states/+/hall-2/#"]


@pytest.mark.parametrize("text, says", [
    ("$share/connectors/machine/states/#", "shared subscription"),
    ("machine/states/#/x", "'#'"),
    ("machine/states/R+", "'+'"),
    ("machine/states/R0815,", "empty"),
    (" , ", "no topic filter"),
    ("machine/states/#,machine/states/R0815", "overlap"),
    ("machine/states/+,machine/states/R0815", "overlap"),
])
def test_filters_that_would_break_order_or_bring_a_row_twice_are_refused(text, says):
    with pytest.raises(FilterError, match=re.escape(says)):
        parse_filters(text)


@pytest.mark.parametrize("first, second, expected", [
    ("machine/states/#", "machine/states", True),  # '#' matches its parent level too
    ("machine/states/+", "machine/states", False),
    ("machine/states/A", "machine/states/B", False),
    ("machine/+/A", "machine/states/+", True),
    ("machine/states/A/#", "machine/states/B/#", False),
    ("a/b", "a/b/c", False),
])
def test_overlap(first, second, expected):
    assert overlap(first, second) is expected
    assert overlap(second, first) is expected


@pytest.mark.parametrize("wider, narrower, expected", [
    ("machine/states/#", "machine/states/#", True),
    ("#", "machine/states/#", True),
    ("machine/+/#", "machine/states/#", True),
    ("machine/states/+", "machine/states/#", False),  # not machine/states itself, nor deeper levels
    ("machine/states", "machine/states/#", False),
    ("machine/states/+/hall-1/#", "machine/states/#", False),
    ("machine/states/+", "machine/states/R0815", True),
    ("machine/states/R0815", "machine/states/+", False),
    ("machine/states/#", "machine/states", True),
    ("machine/states/+/#", "machine/states", False),
])
def test_covers(wider, narrower, expected):
    assert covers(wider, narrower) is expected


def test_each_machine_publishes_on_a_topic_of_its_own():
    topic = row_topic("machine/states/{thing}")
    assert topic({"Thing": "R0815"}) == "machine/states/R0815"
    assert topic({"Thing": "Halle 2 Presse"}) == "machine/states/Halle 2 Presse"


@pytest.mark.parametrize("thing", [None, 42, "", "a/b", "R+", "R#", "$SYS", "R\ud800"])
def test_a_thing_that_cannot_be_a_topic_level_goes_to_the_base_topic(thing):
    assert row_topic("machine/states/{thing}")({"Thing": thing}) == "machine/states"


def test_a_fixed_topic_takes_every_row():
    assert row_topic("test/x/states")({"Thing": "R0815"}) == "test/x/states"
