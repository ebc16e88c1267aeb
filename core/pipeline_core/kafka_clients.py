"""Shared confluent-kafka client configuration: every stage builds its clients here."""
from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from .topics import DLQ_MAX_MESSAGE_BYTES


def producer_config(bootstrap_servers: str, **overrides: Any) -> dict[str, Any]:
    """An idempotent producer: acks=all, no reordering or duplicates on retry, batched by linger."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "compression.type": "lz4",
        # Large enough for a dead letter that carries a rejected oversized payload.
        "message.max.bytes": DLQ_MAX_MESSAGE_BYTES + 64 * 1024,
    }
    config.update(overrides)
    return config


def transactional_producer_config(bootstrap_servers: str, transactional_id: str,
                                  **overrides: Any) -> dict[str, Any]:
    """A producer whose writes and consumer offsets commit atomically (exactly-once stages)."""
    return producer_config(bootstrap_servers, **{"transactional.id": transactional_id, **overrides})


def consumer_config(bootstrap_servers: str, group_id: str, **overrides: Any) -> dict[str, Any]:
    """A consumer that only sees committed transactions and commits offsets itself."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "fetch.max.bytes": DLQ_MAX_MESSAGE_BYTES * 2,
        "max.partition.fetch.bytes": DLQ_MAX_MESSAGE_BYTES + 64 * 1024,
    }
    config.update(overrides)
    return config


def produce(producer: Producer, topic: str, value: bytes | None, key: bytes | str | None = None,
            **options: Any) -> None:
    """`producer.produce`, waiting for deliveries to drain the local queue when it is full
    instead of failing with BufferError."""
    while True:
        try:
            producer.produce(topic, value, key, **options)
            return
        except BufferError:
            producer.poll(0.05)


def admin_client(bootstrap_servers: str, **overrides: Any) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap_servers, **overrides})


def kafka_ready(bootstrap_servers: str, timeout: float = 2.0) -> bool:
    """True when a broker answers a metadata request."""
    try:
        # Quiet: "connection refused" is the expected answer while a broker starts.
        metadata = admin_client(bootstrap_servers, log_level=0).list_topics(timeout=timeout)
    except KafkaException:
        return False
    return bool(metadata.brokers)


def wait_for_kafka(bootstrap_servers: str, deadline_s: float = 60.0) -> None:
    """Poll the broker's metadata until it answers, or raise TimeoutError at the deadline."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if kafka_ready(bootstrap_servers, timeout=min(2.0, max(0.1, end - time.monotonic()))):
            return
    raise TimeoutError(f"Kafka at {bootstrap_servers} did not answer within {deadline_s:.0f} s")
