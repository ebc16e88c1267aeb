"""The tests' reader of Kafka topics (support.read_topic) fails when it cannot read what it was asked to,
naming what is missing; a partial read is given only to a caller that asks for it."""
from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from pipeline_core.kafka_clients import admin_client, producer_config
from pipeline_core.topics import TopicSpec, ensure_topics
from support import read_topic, unique

pytestmark = pytest.mark.integration


@pytest.fixture
def topic(bootstrap: str):
    """A topic of three partitions holding 5, 0 and 2 messages."""
    name = unique("test.read-topic")
    admin = admin_client(bootstrap)
    ensure_topics(admin, (TopicSpec(name, 3),))
    producer = Producer(producer_config(bootstrap))
    for partition, count in ((0, 5), (2, 2)):
        for n in range(count):
            producer.produce(name, f"{partition}-{n}".encode(), partition=partition)
    assert producer.flush(30) == 0
    yield name
    for future in admin.delete_topics([name], operation_timeout=30).values():
        future.result(30)


def test_a_read_to_the_end_returns_every_message(bootstrap: str, topic: str) -> None:
    messages = read_topic(bootstrap, topic, idle_s=0.5, deadline_s=60)
    assert sorted((m.partition, m.offset, m.value) for m in messages) == (
        [(0, n, f"0-{n}".encode()) for n in range(5)] + [(2, n, f"2-{n}".encode()) for n in range(2)])


def test_a_read_of_the_expected_reads_on_to_the_surplus_when_asked(bootstrap: str, topic: str) -> None:
    assert len(read_topic(bootstrap, topic, expected=3, deadline_s=60)) == 3  # stops once three came
    messages = read_topic(bootstrap, topic, expected=3, then_idle_s=0.5, deadline_s=60)
    assert len(messages) == 7  # and with then_idle_s, the four beyond them too


def test_fewer_messages_than_expected_fail_naming_each_partition_and_its_end(bootstrap: str, topic: str) -> None:
    began = time.monotonic()
    with pytest.raises(AssertionError) as failure:
        read_topic(bootstrap, topic, expected=8, deadline_s=8)
    assert time.monotonic() - began < 30
    message = str(failure.value)
    assert f"{topic}: 7 of 8 messages within 8 s" in message
    # Every partition was read to its end: what is missing was never written.
    for partition, end in ((0, 5), (1, 0), (2, 2)):
        assert f"partition {partition}: read to offset {end} (its end), end offset {end}" in message, message


def test_a_topic_that_does_not_exist_fails_instead_of_reading_as_empty(bootstrap: str) -> None:
    with pytest.raises(AssertionError, match="Unknown topic"):
        read_topic(bootstrap, unique("test.no-such-topic"), deadline_s=5)


def test_a_read_cut_short_by_its_deadline_fails_naming_the_partitions_not_read_to_their_end(
        bootstrap: str, topic: str) -> None:
    # The reader cannot be quiet for 30 s within 6 s: no partition's read counts as finished.
    with pytest.raises(AssertionError) as failure:
        read_topic(bootstrap, topic, idle_s=30, deadline_s=6)
    assert "7 messages, not to the end" in str(failure.value)


def test_a_partial_read_is_returned_only_when_asked_for(bootstrap: str, topic: str) -> None:
    messages = read_topic(bootstrap, topic, expected=8, deadline_s=8, partial_ok=True)
    assert len(messages) == 7
