"""Partitions' latest and earliest offsets, asked of the broker in one request.

Through an admin client of its own, never a stage's consumer: on a consumer the request waits behind the fetch
in flight to the same broker (up to its fetch.wait.max.ms, 500 ms by default), on every report. The latest
offsets are as a read_committed reader sees them (the last stable offset): what a stage's consumer can reach.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

from .data_loss import Partition
from .kafka_clients import admin_client

log = logging.getLogger(__name__)

# Asks for an offset of each of these partitions; None when the broker does not answer.
OffsetsLookup = Callable[[Iterable[Partition]], dict[Partition, int] | None]


class BrokerOffsets:
    """`latest` and `earliest` (the log start) offsets of partitions, each within `timeout_s` or None."""

    def __init__(self, bootstrap_servers: str, timeout_s: float, *, security: Mapping[str, str] | None = None) -> None:
        self._new_admin = lambda: admin_client(bootstrap_servers, **(security or {}))
        self._admin = self._new_admin()
        self._timeout_s = timeout_s

    def latest(self, partitions: Iterable[Partition]) -> dict[Partition, int] | None:
        return self._ask(partitions, OffsetSpec.latest(), "latest")

    def earliest(self, partitions: Iterable[Partition]) -> dict[Partition, int] | None:
        return self._ask(partitions, OffsetSpec.earliest(), "earliest")

    def _ask(self, partitions: Iterable[Partition], spec: OffsetSpec, which: str) -> dict[Partition, int] | None:
        wanted = {TopicPartition(topic, partition): spec for topic, partition in partitions}
        if not wanted:
            return None
        offsets: dict[Partition, int] = {}
        try:
            futures = self._admin.list_offsets(wanted, isolation_level=IsolationLevel.READ_COMMITTED,
                                               request_timeout=self._timeout_s)
            for position, future in futures.items():
                offsets[(position.topic, position.partition)] = future.result().offset
        except KafkaException as error:
            log.warning("lag unknown: the broker did not give the %s offsets (%s)", which, error.args[0])
            # A new client asks with fresh metadata. This one may keep the leader epochs it knew before a broker
            # restarted: the broker answered it FENCED_LEADER_EPOCH at every report from then on.
            self._admin = self._new_admin()
            return None
        return offsets
