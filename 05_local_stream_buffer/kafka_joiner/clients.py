"""The joiner's Kafka clients: one transactional producer and one consumer per instance, tuned for it."""
from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import Consumer, Producer

from pipeline_core.group_watch import STATISTICS_INTERVAL_MS
from pipeline_core.kafka_clients import consumer_config, security_config, transactional_producer_config

from .settings import KafkaJoinerSettings


def joiner_producer(settings: KafkaJoinerSettings, transactional_id: str) -> Producer:
    """Uncompressed with a 20 ms linger: the broker is local, and lz4 in the client threads cost about
    7 µs per record of the two cores; a commit sends whatever lingers, so the linger only makes produce
    requests fuller, never later."""
    return Producer(transactional_producer_config(settings.kafka_bootstrap_servers, transactional_id,
                                                  **security_config(settings), **{
        "transaction.timeout.ms": settings.transaction_timeout_ms,
        "batch.size": 1_000_000,
        "compression.type": "none",
        "linger.ms": 20,
        "queue.buffering.max.messages": 1_000_000,
    }))


def joiner_consumer(settings: KafkaJoinerSettings, on_statistics: Callable[[str], None]) -> Consumer:
    """The group's consumer; `on_statistics` gets librdkafka's statistics (`pipeline_core.group_watch`)."""
    overrides = {
        "session.timeout.ms": settings.session_timeout_ms,
        # Records of the co-partitioned topic become readable at each commit: fetch them without delay.
        "fetch.wait.max.ms": 10,
        # A fresh co-partitioned topic answers its first fetches with errors until its leader is known;
        # the default 500 ms back-off then delayed the first joins by as much.
        "fetch.error.backoff.ms": 20,
        # Small chunks per partition and fetch: partitions are consumed interleaved, so a key's two
        # streams (often in two partitions) stay close while a backlog is caught up, instead of one
        # running a whole partition ahead and forcing pending records out. (A larger record still
        # comes whole: Kafka returns at least one record per partition.)
        "max.partition.fetch.bytes": 256 * 1024,
        "statistics.interval.ms": STATISTICS_INTERVAL_MS,
        "stats_cb": on_statistics,
    }
    if settings.instance_id:
        # Static membership: a restarted instance gets its partitions back without a rebalance.
        overrides["group.instance.id"] = settings.instance_id
    return Consumer(consumer_config(settings.kafka_bootstrap_servers, settings.group_id, **security_config(settings),
                                    **overrides))
