"""The pipeline's Kafka topics and their idempotent creation."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

log = logging.getLogger(__name__)

TWO_DAYS_MS = str(2 * 24 * 3600 * 1000)
# Rejected payloads are kept whole, up to this size, so the DLQ can hold what the
# connector refused for being too large.
DLQ_MAX_MESSAGE_BYTES = 16 * 1024 * 1024

# `delete`, not `compact`: keys are "thing.quantity", so compaction would keep only the latest value
# of each quantity and erase the time series that joins, restarts and dashboards read back.
_TIME_SERIES = {"cleanup.policy": "delete", "retention.ms": TWO_DAYS_MS}


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)


MACHINE_DATA = TopicSpec("machine.data", 5, dict(_TIME_SERIES))
MACHINE_OUT = TopicSpec("machine.out", 3, dict(_TIME_SERIES))
MACHINE_DLQ = TopicSpec("machine.dlq", 3, {**_TIME_SERIES, "max.message.bytes": str(DLQ_MAX_MESSAGE_BYTES)})
PIPELINE_TOPICS = (MACHINE_DATA, MACHINE_OUT, MACHINE_DLQ)


def ensure_topics(admin: AdminClient, topics: tuple[TopicSpec, ...] = PIPELINE_TOPICS,
                  timeout: float = 30.0) -> list[str]:
    """Create the topics that do not exist yet; returns the names created. Safe to call twice."""
    existing = admin.list_topics(timeout=timeout).topics
    wanted = [NewTopic(t.name, num_partitions=t.partitions, replication_factor=1, config=t.config)
              for t in topics if t.name not in existing]
    if not wanted:
        return []
    created = []
    for name, future in admin.create_topics(wanted, operation_timeout=timeout).items():
        try:
            future.result(timeout)
            created.append(name)
        except KafkaException as error:
            if error.args[0].name() != "TOPIC_ALREADY_EXISTS":  # a concurrent creator won
                raise
    log.info("created topics %s", ", ".join(created) or "(none)")
    return created


def partition_count(admin: AdminClient, topic: str, timeout: float = 30.0) -> int:
    """Partitions of `topic`, waiting up to `timeout` for a just created topic to show in the metadata."""
    deadline = time.monotonic() + timeout
    while True:
        metadata = admin.list_topics(topic, timeout=timeout).topics.get(topic)
        if metadata is not None and metadata.error is None and metadata.partitions:
            return len(metadata.partitions)
        if time.monotonic() > deadline:
            raise SystemExit(f"topic {topic} does not exist ({metadata.error if metadata else 'unknown'})")
        time.sleep(0.1)  # metadata of a new topic reaches the broker's cache shortly
