"""Partitions added to machine.data under a running joiner: records placed as the stream connector places them
(by the partition count, naming the counts in the placement header), the topic grown by the admin API as any
operator tool grows it, and the oracle (tests/join_reference.py, no code of either joiner) over the records in the
order each stream arrived."""
from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import NewPartitions

from join_reference import reference_join
from pipeline_core.kafka_clients import admin_client, consumer_config, produce, producer_config, retry_transient
from pipeline_core.partitioning import thing_partition
from pipeline_core.records import encode_record, record_key
from pipeline_core.stage_health import assess, read_heartbeat
from pipeline_core.topics import partition_count
from support import wait_for

# The header the stream connector names its partition counts in, as this test reads and writes it (its own text:
# the oracle shares no code with the joiners).
PLACEMENT_HEADER = "partitions"


def machine_rows(things: Iterable[str], first_tick: int, ticks: int, tick_ms: int = 100) -> list[dict[str, Any]]:
    """Speed and torque of one axis of each machine, tick after tick (time order over all machines)."""
    start_ms = 1_700_000_000_000
    return [{"thing": thing, "quantity": quantity, "phenomenonTime": start_ms + tick * tick_ms + shift,
             "result": value}
            for tick in range(first_tick, first_tick + ticks)
            for index, thing in enumerate(things)
            for quantity, shift, value in (("actSpeed_C11", index, 1000.0 + (tick * 7 + index) % 97),
                                           ("vaTorque_C11", tick_ms // 2 + index, 2.5 + (tick + index) % 13))]


def moving_things(count: int, before: int, after: int) -> list[str]:
    """Things of which all but one move to another partition when the topic grows from `before` to `after`."""
    moving = [thing for thing in (f"grow-{index}" for index in range(10_000))
              if thing_partition(thing, before) != thing_partition(thing, after)][:count - 1]
    staying = next(thing for thing in (f"stay-{index}" for index in range(10_000))
                   if thing_partition(thing, before) == thing_partition(thing, after))
    return [*moving, staying]


def place(bootstrap: str, topic: str, records: list[dict[str, Any]], history: tuple[int, ...]) -> None:
    """Write `records` as the stream connector writes them, placed by the last count of `history`."""
    producer = Producer(producer_config(bootstrap))
    failures: list[str] = []
    header = [(PLACEMENT_HEADER, ",".join(map(str, history)).encode())]
    for record in records:
        refused = produce(producer, topic, encode_record(record), record_key(record["thing"], record["quantity"]),
                          partition=thing_partition(record["thing"], history[-1]), headers=header,
                          on_delivery=lambda error, _m: failures.append(str(error)) if error else None)
        assert refused is None, refused
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not failures, failures[:3]


def grow(bootstrap: str, topic: str, partitions: int) -> int:
    """Add partitions with the admin API, as `kafka-topics --alter --partitions` does; the count read back."""
    admin = admin_client(bootstrap)
    (future,) = admin.create_partitions([NewPartitions(topic, partitions)], request_timeout=30).values()
    future.result(30)
    return wait_for(lambda: (count := partition_count(admin, topic)) == partitions and count, 30,
                    f"{topic} to show {partitions} partitions")


def read_with_placement(bootstrap: str, topic: str) -> list[tuple[int, int, int, bytes]]:
    """Every record of `topic` (read_committed) as (placed by, partition, offset, value)."""
    consumer = Consumer(consumer_config(bootstrap, "growth-test-reader", **{"enable.partition.eof": True}))
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        consumer.assign([TopicPartition(topic, partition, 0) for partition in metadata.partitions])
        left, found = set(metadata.partitions), []
        while left:
            for message in consumer.consume(1000, 5.0):
                if message.error() is not None:
                    left.discard(message.partition())
                    continue
                header = dict(message.headers() or []).get(PLACEMENT_HEADER, b"0")
                found.append((int(header.split(b",")[-1]), message.partition(), message.offset(), message.value()))
        return found
    finally:
        consumer.close()


def reference_outputs(data: list[tuple[int, int, int, bytes]]) -> Counter[str]:
    """The oracle over machine.data: each stream in the order it arrived, records placed by an earlier count
    before those placed by a later one (a thing's records move partition only when its writer switched)."""
    records = [json.loads(value) for _, _, _, value in sorted(data)]
    return Counter(json.dumps(output, sort_keys=True) for output in reference_join(records))


def as_counter(values: Iterable[bytes]) -> Counter[str]:
    return Counter(json.dumps(json.loads(value), sort_keys=True) for value in values)


def committed_past(bootstrap: str, group: str, topic: str, ends: dict[int, int]) -> bool:
    """Whether `group` committed at or past `ends` in every partition."""
    consumer = Consumer(consumer_config(bootstrap, group))
    try:
        committed = consumer.committed([TopicPartition(topic, partition) for partition in ends], timeout=10)
    finally:
        consumer.close()
    return all(position.offset >= ends[position.partition] for position in committed if ends[position.partition])


def ends_of(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer(consumer_config(bootstrap, "growth-test-reader"))
    try:
        count = len(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        # A partition just added may have no leader the client knows of yet: asked again until it answers.
        return {partition: retry_transient(
            lambda partition=partition: consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1],
            what=f"the end of {topic} [{partition}]", deadline_s=30) for partition in range(count)}
    finally:
        consumer.close()


class GrowthWatch(threading.Thread):
    """From a growth of machine.data on (`grown_at`, Unix time): when the stream connector placed records by the new
    count (its log says so), and when every stage had reported after that, healthy, with at most `CAUGHT_UP_LAG`
    records waiting: the recovery time. Read from the stack's state folder (the stages' logs and heartbeats)."""

    CAUGHT_UP_LAG = 1_000

    def __init__(self, state_dir: Path, grown_at: float, count: int, deadline_s: float = 900.0) -> None:
        super().__init__(daemon=True, name="growth-watch")
        self.state_dir = state_dir
        self.grown_at = grown_at
        self.count = count
        self.deadline_s = deadline_s
        self.switched_s: float | None = None  # growth -> the connector placed by the new count
        self.recovered_s: float | None = None  # growth -> every stage caught up after that
        self.lagging: list[str] = []

    def run(self) -> None:
        end = time.time() + self.deadline_s
        while time.time() < end and self.recovered_s is None:
            switched = self._switched_at()
            if switched is not None:
                self.switched_s = switched - self.grown_at
                self.lagging = self._lagging(switched)
                if not self.lagging:
                    self.recovered_s = time.time() - self.grown_at
                    return
            time.sleep(0.5)

    def _switched_at(self) -> float | None:
        log = self.state_dir / "stream-connector" / "stream-connector.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        found = re.search(rf"^(\S+ \S+) INFO +stream_connector.partition_switch: placing records by {self.count} "
                          "partitions", text, re.MULTILINE)
        if found is None:
            return None
        return datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()

    def _lagging(self, since: float) -> list[str]:
        lagging = []
        for beat_file in sorted(self.state_dir.glob("*/progress.json")):
            heartbeat = read_heartbeat(beat_file)
            verdict = assess(heartbeat, time.time())
            if heartbeat is None or heartbeat.reported_at < since or not verdict.healthy \
                    or (heartbeat.lag or 0) > self.CAUGHT_UP_LAG:
                lagging.append(f"{beat_file.parent.name}: {verdict.state}, lag {verdict.lag}")
        return lagging


class StatusBeforeDown:
    """A private stack (mixed in before its class) that reads `python -m stack status --json` just before its `down`:
    every stage must be healthy when the run ends, none stale or stuck."""

    final_status: dict | None = None

    def stack(self, *args: str, timeout_s: float = 600, check: bool = True) -> str:
        if args[:1] == ("down",) and self.final_status is None:
            self.final_status = json.loads(super().stack("status", "--json", timeout_s=300))
        return super().stack(*args, timeout_s=timeout_s, check=check)


def unhealthy(status: dict | None) -> list[str]:
    """The services `status --json` does not call healthy (all, when there is no status)."""
    if status is None:
        return ["no status read"]
    return [f"{service['name']}: {service['health']} {service.get('stage_detail') or ''}"
            for service in status["services"] if service["health"] != "healthy"]
