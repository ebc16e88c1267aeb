"""The DB connector's Kafka loop against real Kafka, with an in-memory sink instead of InfluxDB: what the loop
promises whatever the store (commit only after the sink took a batch, wait out its outage with the partitions
paused, honour its back-pressure, dead-letter what it cannot convert or refuses)."""
from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from db_connector.connector import DbConnector
from db_connector.settings import DbConnectorSettings
from db_connector.sink import Consumed, Refused, Sink, SinkUnavailable, Source
from pipeline_core.kafka_clients import consumer_config, producer_config
from pipeline_core.records import InvalidRecord
from pipeline_core.settings import load_settings
from support import read_topic, unique, wait_for

BATCH_SIZE = 50


class MemorySink(Sink[str]):
    """Stores each record's `id`; its store can be made away, slow down the loop, or refuse ids."""

    name = "memory"

    def __init__(self) -> None:
        self.stored: list[str] = []
        self.attempts = 0
        self.away = threading.Event()
        self.retry_after_s: float | None = None  # with `away`: back-pressure, the store names the pause
        self.refused_ids: set[str] = set()

    def convert(self, record: Consumed) -> str:
        if record.source is Source.DEAD_LETTER:
            return f"dead letter {record.partition}@{record.offset}"
        try:
            return str(json.loads(record.value)["id"])
        except (TypeError, ValueError, KeyError) as error:
            raise InvalidRecord(f"no record with an id: {error!r}") from None

    def write(self, items: Sequence[str]) -> list[Refused]:
        self.attempts += 1
        if self.away.is_set():
            raise SinkUnavailable("the store is away", self.retry_after_s)
        refused = [Refused(index, "id not welcome") for index, item in enumerate(items) if item in self.refused_ids]
        self.stored.extend(item for item in items if item not in self.refused_ids)
        return refused

    def health_values(self) -> Mapping[str, int]:
        return {"memory_writes": self.attempts}


@pytest.fixture
def running(bootstrap: str, new_topics) -> Iterator[Callable[[MemorySink], tuple[DbConnector, object]]]:
    stops = []

    def start(sink: MemorySink) -> tuple[DbConnector, object]:
        topics = new_topics()
        settings = load_settings(DbConnectorSettings, [
            "--kafka-bootstrap-servers", bootstrap, "--data-topic", topics.data, "--out-topic", topics.out,
            "--dlq-topic", topics.dlq, "--group-id", unique("db-connector-sink"), "--batch-size", str(BATCH_SIZE),
            "--flush-interval-s", "0.2", "--retry-max-s", "0.5", "--no-health-metrics"])
        connector = DbConnector(settings, sink)
        runner = threading.Thread(target=connector.run, name="db-connector")
        runner.start()
        stops.append((connector, runner))
        return connector, topics

    yield start
    for connector, runner in stops:
        connector.stop.set()
        runner.join(60)
        assert not runner.is_alive()


def produce_values(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer(producer_config(bootstrap))
    for value in values:
        producer.produce(topic, value, partition=0)
    assert producer.flush(30) == 0


def committed(bootstrap: str, connector: DbConnector, topic: str) -> int:
    """The group's committed offset of `topic`'s partition 0 (negative: none)."""
    reader = Consumer(consumer_config(bootstrap, connector.settings.group_id))
    try:
        return reader.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
    finally:
        reader.close()


def stored_ids(sink: MemorySink) -> list[str]:
    """The records of machine.data the sink stored, in id order (beside the counts of machine.dlq's letters)."""
    return sorted((item for item in sink.stored if item.isdigit()), key=int)


def records(ids: range) -> list[bytes]:
    return [json.dumps({"id": str(n)}).encode() for n in ids]


def test_an_outage_of_the_sink_holds_the_commit_and_pauses_fetching_then_everything_is_stored(bootstrap, running):
    sink = MemorySink()
    sink.away.set()
    connector, topics = running(sink)
    produce_values(bootstrap, topics.data, records(range(200)) + [b"not json", b"{}"])
    wait_for(lambda: sink.attempts >= 4, 60, "the loop to retry the write while the store is away")
    # Fetching is paused while the batch waits: no more than one batch was taken in, nothing committed.
    assert 0 < connector.counters.records_in <= BATCH_SIZE
    assert committed(bootstrap, connector, topics.data) < 0
    assert sink.stored == []

    sink.away.clear()
    wait_for(lambda: committed(bootstrap, connector, topics.data) == 202, 60, "every offset committed")
    assert stored_ids(sink) == [str(n) for n in range(200)]  # once each: no batch went twice
    letters = [json.loads(message.value) for message in read_topic(bootstrap, topics.dlq, expected=2)]
    assert sorted(letter["offset"] for letter in letters) == [200, 201]
    assert all(letter["reason"].startswith("no record with an id") for letter in letters)


def test_the_lag_counts_the_backlog_that_grows_while_the_sink_is_away(bootstrap, running):
    """Fetching is paused while the loop waits for the sink, so the consumer's cached ends stop where they were:
    a lag read from them stayed near 0 while millions of records piled up behind an InfluxDB outage."""
    sink = MemorySink()
    sink.away.set()
    connector, topics = running(sink)
    produce_values(bootstrap, topics.data, records(range(100)))
    wait_for(lambda: sink.attempts >= 2, 60, "the loop to wait for the store with a batch in hand")
    produce_values(bootstrap, topics.data, records(range(100, 400)))  # behind the paused fetch
    # The broker's end of partition 0 minus the position: at least the 300 never fetched. Read from the cached end,
    # the lag was at most the 100 fetched before the pause.
    wait_for(lambda: (connector.lag() or 0) >= 300, 60, "the lag to count the 300 records produced during the outage")
    sink.away.clear()
    wait_for(lambda: committed(bootstrap, connector, topics.data) == 400, 60, "every offset committed")


def test_back_pressure_waits_the_pause_the_sink_names_without_fetching_more(bootstrap, running):
    sink = MemorySink()
    sink.retry_after_s = 0.05
    sink.away.set()
    connector, topics = running(sink)
    produce_values(bootstrap, topics.data, records(range(120)))
    # At most 0.05 s apart, where the loop's own backoff would reach its 0.5 s bound: the sink's pause is taken.
    wait_for(lambda: sink.attempts >= 20, 30, "twenty write attempts at the sink's pace")
    assert connector.counters.records_in <= BATCH_SIZE
    sink.away.clear()
    wait_for(lambda: committed(bootstrap, connector, topics.data) == 120, 60, "every offset committed")
    assert stored_ids(sink) == [str(n) for n in range(120)]


def test_items_the_sink_refuses_become_dead_letters_and_the_rest_is_stored(bootstrap, running):
    sink = MemorySink()
    sink.refused_ids = {"3", "17", "42"}
    connector, topics = running(sink)
    produce_values(bootstrap, topics.data, records(range(60)))
    wait_for(lambda: committed(bootstrap, connector, topics.data) == 60, 60, "every offset committed")
    assert stored_ids(sink) == [str(n) for n in range(60) if str(n) not in sink.refused_ids]
    letters = [json.loads(message.value) for message in read_topic(bootstrap, topics.dlq, expected=3)]
    assert sorted(letter["offset"] for letter in letters) == [3, 17, 42]
    assert {letter["reason"] for letter in letters} == {"memory refused the point: id not welcome"}
    assert connector.counters.dead_letters == 3
    # The connector's own dead letters come back from machine.dlq as one count each.
    wait_for(lambda: sum(item.startswith("dead letter") for item in sink.stored) == 3, 60, "the letters counted")
