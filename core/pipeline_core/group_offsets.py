"""Another consumer group's committed offsets, read and written from outside the group, and whether records lie
unread below a position.

A stage asks these of a group it is not a member of: the stream connector asks whether the joiners have read what
it wrote before it places records by a topic's new partition count (`stream_connector.partition_switch`), and keeps
the counts it has placed records with as its own group's commit metadata. Through a consumer that never joins the
group, not the admin client: the admin client's offset requests crash librdkafka 2.16 on a broker without
__consumer_offsets yet.
"""
from __future__ import annotations

import time
from collections.abc import Mapping

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from .kafka_clients import consumer_config, raise_partition_errors

REQUEST_TIMEOUT_S = 10.0
# A read of records below a position waits at most this long for the first fetch (one round trip normally).
UNREAD_READ_TIMEOUT_S = 5.0


def group_client(bootstrap_servers: str, group_id: str, security: Mapping[str, str] | None = None) -> Consumer:
    """A consumer of `group_id` that joins no group: it reads and commits the group's offsets only."""
    return Consumer(consumer_config(bootstrap_servers, group_id, **(security or {}), log_level=0,
                                    **{"enable.partition.eof": True}))


def committed(client: Consumer, topic: str, partitions: int,
              timeout_s: float = REQUEST_TIMEOUT_S) -> dict[int, TopicPartition]:
    """Partition -> the offset (with its metadata) `client`'s group committed in `topic`'s first `partitions`
    partitions; partitions without a commit left out."""
    positions = raise_partition_errors(client.committed([TopicPartition(topic, partition)
                                                         for partition in range(partitions)], timeout=timeout_s))
    return {position.partition: position for position in positions if position.offset >= 0}


def commit(client: Consumer, positions: list[TopicPartition]) -> None:
    """Commit `positions` (with their metadata) as `client`'s group's, synchronously. The group must have no
    member: Kafka refuses a commit from outside a group with members."""
    raise_partition_errors(client.commit(offsets=positions, asynchronous=False) or [])


def unread_below(bootstrap_servers: str, reader_group: str, topic: str, starts: Mapping[int, int],
                 ends: Mapping[int, int], security: Mapping[str, str] | None = None,
                 timeout_s: float = UNREAD_READ_TIMEOUT_S) -> dict[int, int] | None:
    """Of the partitions where `starts` (a reader's position; absent: the partition's beginning) lies below `ends`,
    those with a record a read_committed reader is handed in between: partition -> the first such offset. What lies
    between may be only transaction markers and aborted records, which a reader never sees, and its position then
    never reaches the end. `reader_group` names the reader (it joins no group and commits nothing). None when Kafka
    does not answer in `timeout_s`."""
    gaps = {partition: (starts.get(partition, OFFSET_BEGINNING), end) for partition, end in ends.items()
            if starts.get(partition, -1) < end}
    if not gaps:
        return {}
    reader = group_client(bootstrap_servers, reader_group, security)
    try:
        reader.assign([TopicPartition(topic, partition, start) for partition, (start, _) in gaps.items()])
        open_gaps = set(gaps)
        unread: dict[int, int] = {}
        deadline = time.monotonic() + timeout_s
        while open_gaps:
            if time.monotonic() > deadline:
                return None
            for message in reader.consume(100, 0.2):
                partition = message.partition()
                if partition not in open_gaps:
                    continue
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        open_gaps.discard(partition)
                    elif error.fatal():
                        raise KafkaException(error)
                    continue
                if message.offset() < gaps[partition][1]:
                    unread[partition] = message.offset()
                open_gaps.discard(partition)
        return unread
    finally:
        reader.close()
