"""The connector's Kafka side: its producer, and what it learns of Kafka before and while it writes.

The producer never gives up on a record by default (no delivery timeout): while Kafka is away the rows stay
unacknowledged and the broker queues those behind them. Before writing, at start and at every fresh start of
the Kafka side, the connector makes sure the topics exist, reads machine.data's partition count (records go
to the partition of their thing), reads back what the topics' tails hold, once every record Kafka holds
is readable (`redelivery`), and starts its partition switch where the topic ends (`partition_switch`).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from pipeline_core.broker_offsets import BrokerOffsets
from pipeline_core.kafka_clients import (KafkaStartupError, admin_client, producer_config, retry_transient,
                                         security_config)
from pipeline_core.lifecycle import StopSignal
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, ensure_topics, partition_count

from .partition_switch import PartitionSwitch, SwitchSettings
from .redelivery import WrittenRecords, dead_letter_key, fence_transactional_id, read_tail, settle_unseen_writes
from .settings import ConnectorSettings

log = logging.getLogger(__name__)

# Records in the producer's queue before `produce` waits: far above what the broker's window of
# unacknowledged rows (max_inflight_messages) times a row's quantities can put there, so the loop
# never blocks on a full queue while Kafka is away (and keeps answering the broker's keepalive).
PRODUCER_QUEUE_MESSAGES = 1_000_000
# How long a look at the data topic's partition count may take (partition_switch): the loop waits for it.
PARTITION_COUNT_TIMEOUT_S = 2.0


def new_producer(settings: ConnectorSettings) -> Producer:
    return Producer(producer_config(settings.kafka_bootstrap_servers, **security_config(settings), **{
        "linger.ms": settings.linger_ms,
        # 0 (the default): never give up on a record while Kafka is away; see the module docstring.
        "message.timeout.ms": settings.delivery_timeout_ms,
        "queue.buffering.max.messages": PRODUCER_QUEUE_MESSAGES}))


@dataclass(frozen=True)
class TopicsRead:
    """What the connector knows of its topics before it writes."""

    written: WrittenRecords  # record values at the tail of the data topic
    dead_lettered: WrittenRecords  # rows (rejected_row_key) whose dead letters are at the tail of the DLQ
    switch: PartitionSwitch  # by which partition count records are placed
    admin: AdminClient  # for the data topic's partition count while running


def read_topics(settings: ConnectorSettings, stage: str, stop: StopSignal, *, without_end: bool = False,
                while_waiting: Callable[[], object] | None = None) -> TopicsRead | None:
    """Create the topics if missing, read the data topic's partitions and both topics' tails, start the partition
    switch (None when stopped first). At start, Kafka has `--kafka-startup-deadline-s` to answer; `without_end`
    (a fresh start of the Kafka side while running) waits for it as long as it takes, as the rows wait in the
    broker's queue, calling `while_waiting` between its rounds."""
    security = security_config(settings)
    admin = admin_client(settings.kafka_bootstrap_servers, **security)
    deadline_s = settings.kafka_startup_deadline_s
    if without_end:
        # Ask in rounds of a reporting interval, reporting between them: the heartbeat goes on saying the
        # connector waits for Kafka with rows in hand (stuck), where silence would say it hangs.
        deadline_s = min(deadline_s, settings.progress_interval_s)
    warn_at = 0.0
    while not stop.is_set():
        try:
            ensure_topics(admin, (dataclasses.replace(MACHINE_DATA, name=settings.data_topic),
                                  dataclasses.replace(MACHINE_DLQ, name=settings.dlq_topic)), deadline_s=deadline_s)
            data_partitions = partition_count(admin, settings.data_topic, deadline_s)
            dlq_partitions = partition_count(admin, settings.dlq_topic, deadline_s)
            # What an earlier run wrote and a follower has not yet taken becomes readable first (redelivery.py).
            retry_transient(lambda: settle_unseen_writes(
                settings.kafka_bootstrap_servers,
                {settings.data_topic: data_partitions, settings.dlq_topic: dlq_partitions},
                fence_transactional_id(settings.mqtt_client_id), security=security),
                what="making every record Kafka holds readable before reading the topics' tails", deadline_s=deadline_s)
            written = read_tail(settings.kafka_bootstrap_servers, settings.data_topic, data_partitions,
                                settings.redelivery_window_records, security=security)
            dead_lettered = read_tail(settings.kafka_bootstrap_servers, settings.dlq_topic, dlq_partitions,
                                      settings.redelivery_window_records, functools.partial(dead_letter_key, stage),
                                      security=security)
            switch = _started_switch(settings, data_partitions, security, deadline_s)
            return TopicsRead(written, dead_lettered, switch, admin)
        except KafkaStartupError as error:
            if not without_end:
                raise
            if while_waiting is not None:
                while_waiting()
            if time.monotonic() >= warn_at:
                log.warning("%s; still waiting for Kafka", error)
                warn_at = time.monotonic() + settings.kafka_startup_deadline_s
    return None


def _started_switch(settings: ConnectorSettings, data_partitions: int, security: dict[str, str],
                    deadline_s: float) -> PartitionSwitch:
    """Which partition count records are placed by (partition_switch): the one this connector placed them by
    before, and where the topic ends now (what earlier runs placed lies below)."""
    topic = settings.data_topic
    offsets = BrokerOffsets(settings.kafka_bootstrap_servers, min(30.0, deadline_s), security=security)
    ends = retry_transient(
        lambda: offsets.latest([(topic, partition) for partition in range(data_partitions)]) or _no_answer(topic),
        what=f"reading where {topic} ends", deadline_s=deadline_s)
    groups = tuple(group.strip() for group in settings.joiner_groups.split(",") if group.strip())
    switch = retry_transient(lambda: PartitionSwitch.started(
        SwitchSettings(topic, groups, settings.partition_check_interval_s, settings.switch_max_pause_s,
                       settings.switch_retry_s),
        settings.kafka_bootstrap_servers, settings.mqtt_client_id, data_partitions,
        {partition: end for (_, partition), end in ends.items()}, security),
        what="reading the partition counts this connector placed records by", deadline_s=deadline_s)
    if switch.partitions != data_partitions:
        log.info("%s has %d partitions; records are placed by %d until the joiners have read every record "
                 "placed so", topic, data_partitions, switch.partitions)
    return switch


def _no_answer(topic: str) -> dict:
    raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"no end offsets of {topic}"))


def data_partitions_now(admin: AdminClient, topic: str) -> int | None:
    """The data topic's partition count as Kafka says now; None when it does not answer in time."""
    try:
        metadata = admin.list_topics(topic, timeout=PARTITION_COUNT_TIMEOUT_S).topics.get(topic)
    except KafkaException:
        return None
    if metadata is None or metadata.error is not None or not metadata.partitions:
        return None
    return len(metadata.partitions)


def producer_knows(producer: Producer, topic: str, partitions: int) -> bool:
    """Whether the producer's metadata holds `partitions` partitions of `topic` (the request refreshes it: a
    producer learns of new partitions only at its next refresh, and refuses a record for one it does not know)."""
    try:
        metadata = producer.list_topics(topic, timeout=PARTITION_COUNT_TIMEOUT_S)
    except KafkaException:
        return False
    found = metadata.topics.get(topic)
    return found is not None and found.error is None and len(found.partitions) >= partitions
