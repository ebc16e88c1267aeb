"""Helpers shared by the tests: polling with deadlines and reading topics to the end."""
from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from pipeline_core.kafka_clients import admin_client, consumer_config, produce, producer_config
from pipeline_core.partitioning import thing_partition
from pipeline_core.records import encode_record
from pipeline_core.topics import partition_count

T = TypeVar("T")


# CLUSTER_TEST_PORTS=first-last: the ports of a test's private servers (cluster, broker) from that range (on a machine
# whose other users hold fixed ports); by default any free ports the system gives.
PORT_RANGE_ENV = "CLUSTER_TEST_PORTS"


def private_port_range() -> str | None:
    """This test process's part of CLUSTER_TEST_PORTS (None when it is not set): with several pytest-xdist workers,
    each takes a slice of its own. A private stack takes the first free ports of its range, so two workers starting
    one at the same moment would take the same ports, and one of the brokers would fail to bind them."""
    whole = os.environ.get(PORT_RANGE_ENV)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not whole or not worker.startswith("gw") or workers < 2:
        return whole
    first, last = (int(part) for part in whole.split("-"))
    size = (last - first + 1) // workers
    start = first + int(worker.removeprefix("gw")) * size
    return f"{start}-{start + size - 1}"


def wait_for(check: Callable[[], T], deadline_s: float, what: str, interval_s: float = 0.05) -> T:
    """Poll `check` until it returns something truthy; fail the test at the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


class ManualClock:
    """Seconds that move only when the test moves them (`now_s`): a stand-in for `time.monotonic`."""

    def __init__(self, now_s: float = 0.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def port_open(host: str, port: int) -> bool:
    """Whether something accepts connections on host:port now."""
    with socket.socket() as probe:
        probe.settimeout(1.0)
        return probe.connect_ex((host, port)) == 0


def confirm_down(addresses: str, what: str, deadline_s: float = 30) -> None:
    """A server a test stopped is gone: every one of `addresses` ("host:port,...") refuses connections."""
    endpoints = [(host, int(port)) for host, port in (address.rsplit(":", 1) for address in addresses.split(","))]
    wait_for(lambda: not any(port_open(host, port) for host, port in endpoints), deadline_s,
             f"{what} to refuse connections on {addresses}")


def unique(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:10]}"


@dataclass(frozen=True)
class Message:
    key: bytes | None
    value: bytes | None
    partition: int
    offset: int
    timestamp_ms: int
    headers: tuple[tuple[str, bytes | None], ...] = ()

    @property
    def placed_by(self) -> int:
        """The partition count its writer placed it by, as the stream connector's header names it (the last of the
        counts; 0 when it names none). Read here by the test's own text: it shares no code with the joiners."""
        value = dict(self.headers).get("partitions") or b"0"
        return int(value.split(b",")[-1])


def read_topic(bootstrap: str, topic: str, *, expected: int | None = None, deadline_s: float = 60.0,
               idle_s: float = 2.0, isolation: str = "read_committed",
               security: Mapping[str, str] | None = None, partial_ok: bool = False,
               then_idle_s: float | None = None) -> list[Message]:
    """Read `topic` from the beginning.

    With `expected`, stop as soon as that many messages arrived (with `then_idle_s`, read on until the consumer is
    at the end of every partition and nothing more arrives for that long, so a surplus, duplicates, comes too);
    without it, stop once the consumer is at the end of every partition and nothing arrives for `idle_s`. Not there
    by the deadline, the read fails, naming each partition's position and end; `partial_ok`: return what arrived
    instead (for a caller that samples a topic still being written and says so). `security`: the reader's identity
    on a secure Kafka (kafka_clients.security_config).
    """
    consumer = Consumer(consumer_config(bootstrap, unique("test-reader"), **(security or {}), **{
        "isolation.level": isolation, "enable.partition.eof": True}))
    consumer.subscribe([topic])
    messages: list[Message] = []
    end = time.monotonic() + deadline_s
    last_arrival = time.monotonic()
    at_end: set[int] = set()
    positions: dict[int, int] = {}  # partition -> the next offset to read
    partitions: int | None = None
    complete = False
    try:
        while time.monotonic() < end:
            if expected is not None and len(messages) >= expected:
                if then_idle_s is None:
                    complete = True
                    break
                # Read on, as a read to the end does, with time for it however late the last expected one came.
                expected, idle_s, end = None, then_idle_s, max(end, time.monotonic() + then_idle_s + 30)
            message = consumer.poll(0.2)
            if message is None:
                if (expected is None and partitions is not None and len(at_end) >= partitions
                        and time.monotonic() - last_arrival > idle_s):
                    complete = True
                    break
                continue
            if message.error():
                if message.error().code() == -191:  # _PARTITION_EOF
                    at_end.add(message.partition())
                    positions[message.partition()] = message.offset()
                    if partitions is None:
                        partitions = len(consumer.list_topics(topic, timeout=5).topics[topic].partitions)
                    continue
                raise AssertionError(f"consumer error: {message.error()}")
            at_end.discard(message.partition())
            positions[message.partition()] = message.offset() + 1
            last_arrival = time.monotonic()
            messages.append(Message(message.key(), message.value(), message.partition(), message.offset(),
                                    message.timestamp()[1], tuple(message.headers() or ())))
        if expected is not None and len(messages) >= expected:
            complete = True
        missing = "" if complete or partial_ok else _what_is_missing(consumer, topic, positions, at_end)
    finally:
        consumer.close()
    if missing:
        wanted = f"{len(messages)} of {expected} messages" if expected is not None else \
            f"{len(messages)} messages, not to the end"
        raise AssertionError(f"{topic}: {wanted} within {deadline_s:.0f} s; {missing}")
    return messages


def _what_is_missing(consumer: Consumer, topic: str, positions: dict[int, int], at_end: set[int]) -> str:
    """Each partition: where the read got to, whether that was its end, and the partition's end offset."""
    try:
        metadata = consumer.list_topics(topic, timeout=5).topics[topic]
        numbers = sorted(metadata.partitions) if metadata.error is None else []
    except KafkaException as error:
        return f"the topic's partitions unknown ({error})"
    if not numbers:
        return "the topic has no partitions (does it exist?)"
    parts = []
    for number in numbers:
        try:
            _low, high = consumer.get_watermark_offsets(TopicPartition(topic, number), timeout=5)
            end = f"end offset {high}"
        except KafkaException as error:
            end = f"end offset unknown ({error})"
        read = f"read to offset {positions[number]}" if number in positions else "nothing read"
        parts.append(f"partition {number}: {read}{' (its end)' if number in at_end else ''}, {end}")
    return "; ".join(parts)


def produce_records(bootstrap: str, topic: str, records: Iterable[dict[str, Any]],
                    key: Callable[[dict[str, Any]], str] | None = None, *, by_thing: bool = False) -> int:
    """Produce JSON records and wait until Kafka confirmed every one; returns the count. With `by_thing`,
    each record goes to the partition of its thing, as the stream connector writes them."""
    producer = Producer(producer_config(bootstrap))
    failures: list[str] = []
    count = 0
    partitions = partition_count(admin_client(bootstrap), topic) if by_thing else 0

    def on_delivery(error, _message) -> None:
        if error is not None:
            failures.append(str(error))

    for record in records:
        options = {"partition": thing_partition(record["thing"], partitions)} if by_thing else {}
        # Waits for deliveries while the local queue is full: a few hundred thousand records outgrow it.
        refused = produce(producer, topic, encode_record(record), key(record) if key else None,
                          on_delivery=on_delivery, **options)
        assert refused is None, refused
        producer.poll(0)
        count += 1
    producer.flush(60)
    assert not failures, failures[:3]
    return count


def processes_under(state_dir: Path) -> set[int]:
    """PIDs of what a stack on `state_dir` runs: supervisord and everything it started inherit
    STACK_STATE_DIR from the `up` that started supervisord."""
    marker = f"STACK_STATE_DIR={state_dir}".encode()
    pids = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "environ").read_bytes().split(b"\0"):
                pids.add(int(entry.name))
        except OSError:
            pass
    return pids
