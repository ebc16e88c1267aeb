"""Kafka plumbing of the peer runs: pre-loading the input, producing it at a steady rate, and reading a peer's
output as a read_committed consumer sees it, with the moment each record became visible."""
from __future__ import annotations

import multiprocessing
import threading
import time
import uuid
from collections.abc import Sequence

from confluent_kafka import Consumer, Producer, TopicPartition

from pipeline_core.kafka_clients import consumer_config, produce, producer_config

from .workload import Message


def preload(bootstrap: str, topic: str, messages: Sequence[Message]) -> None:
    """Append the messages in their order, each to its partition, and wait until all are acknowledged."""
    producer = Producer(producer_config(bootstrap, **{"linger.ms": 50, "batch.size": 1_000_000,
                                                      "queue.buffering.max.messages": 2_000_000}))
    for message in messages:
        produce(producer, topic, message.value, message.key, partition=message.partition)
    if producer.flush(120):
        raise RuntimeError(f"pre-load of {topic} was not acknowledged")


def produce_paced(bootstrap: str, topic: str, messages: Sequence[Message], rate: float,
                  appended: multiprocessing.Queue) -> None:
    """A producer process's target: append the messages at ``rate`` per second, then put the wall-clock time
    each was handed to the producer on ``appended`` (one list, in the messages' order)."""
    producer = Producer(producer_config(bootstrap, **{"linger.ms": 2}))
    # The pace starts once a first record is acknowledged: until the connection and the idempotent producer's
    # id are set up, paced records would queue locally and reach the broker as one burst.
    producer.list_topics(topic, timeout=30)
    times: list[float] = []
    started = time.monotonic()
    for count, message in enumerate(messages):
        if count % 50 == 0:
            ahead = count / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
        times.append(time.time())
        produce(producer, topic, message.value, message.key, partition=message.partition)
        producer.poll(0)
    if producer.flush(60):
        raise RuntimeError(f"paced input to {topic} was not acknowledged")
    appended.put(times)


def end_offsets(bootstrap: str, topic: str) -> dict[str, dict[str, int]]:
    """The end offset of each partition of ``topic``, in the shape of Spark's source offsets."""
    consumer = Consumer(consumer_config(bootstrap, f"join-peers-offsets.{uuid.uuid4().hex[:8]}"))
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        return {topic: {str(partition): consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)[1]
                        for partition in partitions}}
    finally:
        consumer.close()


class OutputReader(threading.Thread):
    """Reads ``topic`` from its start as a read_committed consumer, noting when each record became visible."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(name=f"reader-{topic}", daemon=True)
        self.values: list[bytes] = []
        self.visible_at: list[float] = []  # wall clock, per value
        self.cpu_seconds = 0.0  # this thread's own, so a peer in this process can leave it out of its figures
        # Warnings off: a reader of a topic created a moment ago logs one per poll until the topic's leaders
        # are known.
        self._consumer = Consumer(consumer_config(bootstrap, f"join-peers-reader.{uuid.uuid4().hex[:8]}",
                                                  log_level=3))
        self._consumer.subscribe([topic])
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self._stopping.is_set():
                messages = [message for message in self._consumer.consume(10_000, 0.05) if not message.error()]
                if messages:
                    now = time.time()
                    self.values.extend(message.value() for message in messages)
                    self.visible_at.extend([now] * len(messages))
                self.cpu_seconds = time.thread_time()
        finally:
            self._consumer.close()

    def idle_seconds(self, since: float = 0.0) -> float:
        """Seconds since the last record arrived, or since ``since`` (wall clock) or the reader started if that
        was later."""
        last = max(self.visible_at[-1] if self.visible_at else self._started_at, since)
        return time.time() - last

    def start(self) -> None:
        self._started_at = time.time()
        super().start()

    def stop(self) -> None:
        self._stopping.set()
        self.join(30)
