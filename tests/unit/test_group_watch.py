"""The watch that ends a process whose consumer stays outside its group while Kafka serves the group
(`pipeline_core.group_watch`): its decision, on a clock of the test's. That librdkafka's statistics read as it
expects, and that the probe and the exit work, is shown with real clients in tests/integration/test_group_watch_clients.py."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from pipeline_core.group_watch import (PROBE_AFTER_S, PROBE_INTERVAL_S, SERVED_GRACE_S, ConsumerWedged, GroupWatch,
                                       group_handler_state)
from support import ManualClock


class Kafka:
    """Whether Kafka answers for the group, and how often it was asked; an answer comes back by the next check."""

    def __init__(self, serves: bool, answers: bool = True) -> None:
        self.serves = serves
        self.answers = answers  # False: a request stays on its way (Kafka away: it waits out its timeout)
        self.asked = 0
        self._on_its_way = False

    def ask(self) -> None:
        if not self._on_its_way:
            self.asked += 1
            self._on_its_way = True

    def answer(self) -> bool | None:
        if not self._on_its_way or not self.answers:
            return None
        self._on_its_way = False
        return self.serves


def statistics(state: str, state_age_ms: int = 0) -> str:
    return json.dumps({"name": "rdkafka#consumer-1", "type": "consumer",
                       "cgrp": {"state": state, "stateage": state_age_ms, "join_state": "steady",
                                "rebalance_age": 0, "rebalance_cnt": 1, "assignment_size": 3}})


def run(watch: GroupWatch, clock: Clock, seconds: float, step_s: float = 0.5) -> None:
    """The consumer's loop: a check every `step_s` for `seconds`."""
    end = clock.now_s + seconds
    while clock.now_s < end:
        clock.now_s += step_s
        watch.check()


def test_the_handler_state_is_read_from_the_statistics_and_nothing_else() -> None:
    handler = group_handler_state(statistics("query-coord", 12_345))
    assert handler is not None and (handler.state, handler.state_age_ms) == ("query-coord", 12_345)
    assert group_handler_state(json.dumps({"name": "rdkafka#producer-1", "type": "producer"})) is None


@settings(max_examples=300)
@given(st.one_of(st.text(), st.binary().map(lambda raw: raw.decode("latin-1")),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                              lambda children: st.lists(children) | st.dictionaries(st.text(), children))
                 .map(lambda value: json.dumps({"cgrp": value}))))
def test_whatever_the_statistics_hold_reading_them_raises_nothing(text: str) -> None:
    handler = group_handler_state(text)
    assert handler is None or isinstance(handler.state, str) and isinstance(handler.state_age_ms, int)


def test_a_consumer_in_its_group_is_never_probed() -> None:
    clock, kafka = ManualClock(1000.0), Kafka(serves=True)
    watch = GroupWatch("g", kafka, clock)
    watch.on_statistics(statistics("up", 600_000))
    run(watch, clock, 600)
    assert kafka.asked == 0 and watch.outside_s() == 0


def test_kafka_away_lets_the_consumer_wait_however_long() -> None:
    clock, kafka = ManualClock(1000.0), Kafka(serves=False)
    watch = GroupWatch("g", kafka, clock)
    watch.on_statistics(statistics("query-coord"))
    run(watch, clock, 3600)
    assert kafka.asked > 0  # asked, and never ended
    assert watch.outside_s() == pytest.approx(3600, abs=1)


def test_a_request_on_its_way_is_neither_sent_again_nor_taken_for_an_answer() -> None:
    clock, kafka = ManualClock(1000.0), Kafka(serves=True, answers=False)
    watch = GroupWatch("g", kafka, clock)
    watch.on_statistics(statistics("query-coord"))
    run(watch, clock, 600)
    assert kafka.asked == 1


def test_outside_while_kafka_serves_the_group_ends_after_the_grace() -> None:
    clock, kafka = ManualClock(1000.0), Kafka(serves=True)
    watch = GroupWatch("g", kafka, clock)
    watch.on_statistics(statistics("wait-coord", 1_000))  # left the group a second ago
    run(watch, clock, PROBE_AFTER_S - 1 - 0.5)
    assert kafka.asked == 0, "asked before the consumer was outside for PROBE_AFTER_S"
    run(watch, clock, 1)  # the first answer: the grace starts
    assert kafka.asked == 1
    run(watch, clock, SERVED_GRACE_S - PROBE_INTERVAL_S)
    with pytest.raises(ConsumerWedged, match="outside group g"):
        run(watch, clock, PROBE_INTERVAL_S + 0.5)
    assert clock.now_s - 1000.0 <= PROBE_AFTER_S + SERVED_GRACE_S + PROBE_INTERVAL_S


def test_a_consumer_back_in_its_group_within_the_grace_goes_on() -> None:
    clock, kafka = ManualClock(1000.0), Kafka(serves=True)
    watch = GroupWatch("g", kafka, clock)
    watch.on_statistics(statistics("query-coord"))
    run(watch, clock, PROBE_AFTER_S + SERVED_GRACE_S - PROBE_INTERVAL_S)
    assert kafka.asked > 1, "the grace never began: the test proves nothing"
    watch.on_statistics(statistics("up"))
    run(watch, clock, 600)
    assert watch.outside_s() == 0
    # Out again later: a new wait, a new grace.
    watch.on_statistics(statistics("query-coord"))
    asked_before = kafka.asked
    run(watch, clock, PROBE_AFTER_S + SERVED_GRACE_S - PROBE_INTERVAL_S)
    assert kafka.asked > asked_before


def test_the_grace_starts_again_when_kafka_was_away_in_between() -> None:
    """Kafka answering for a moment during an outage is not a consumer left behind: the grace counts from the
    answer after the last one missing."""
    clock, kafka = ManualClock(1000.0), Kafka(serves=True)
    watch = GroupWatch("g", kafka, clock)
    watch.on_statistics(statistics("query-coord"))
    run(watch, clock, PROBE_AFTER_S + SERVED_GRACE_S - PROBE_INTERVAL_S)
    kafka.serves = False
    run(watch, clock, 2 * PROBE_INTERVAL_S)
    kafka.serves = True
    run(watch, clock, SERVED_GRACE_S - PROBE_INTERVAL_S)
    with pytest.raises(ConsumerWedged):
        run(watch, clock, 2 * PROBE_INTERVAL_S)
