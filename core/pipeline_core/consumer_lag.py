"""The lag of assigned partitions a consumer has delivered nothing of since their assignment.

librdkafka knows a partition's position once it delivered something of it, or skipped past transaction markers
and aborted records, and its end from every fetch: the lag of a partition being fetched is known from cached
values and costs nothing. A partition without a position is usually caught up: its committed offset is its end,
so nothing came to deliver. But it may also not be fetched at all. librdkafka keeps a partition's pause through
its revocation, so a partition paused before and given back stays paused, and its cached end stops where it
was. Such a partition looked idle, and a stage that never fetched again stayed healthy by its heartbeat.

For these partitions the lag is asked of the broker: from where the consumer starts reading (the group's
committed offset unless the stage sought elsewhere; the earliest offset without either) to the end. A consumer
that fetches moves past whatever lies between the two, records, markers or aborted records, within a fetch, so
lag that stays there is work it is not doing.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from .broker_offsets import BrokerOffsets
from .data_loss import Partition

# How long a progress report waits for each request of `unfetched_lag` (a stage's BrokerOffsets for it take
# this timeout too): while Kafka is away, the stage's loop stalls this long at most per request, up to three per
# report.
REPORT_REQUEST_TIMEOUT_S = 1.0


def unfetched_lag(consumer: Consumer, partitions: Sequence[TopicPartition], offsets: BrokerOffsets) -> int | None:
    """Records of `consumer`'s assigned `partitions` (none delivered since their assignment) from where it starts
    reading each to its end. A partition's offset is that start; a logical one means the group's committed
    offset (OFFSET_BEGINNING: the earliest offset, as a partition without a committed offset starts too). The
    ends and earliest offsets come from `offsets`; the committed offsets from the consumer, whose coordinator
    requests do not wait behind its fetches. None when the broker does not answer one of these requests."""
    if not partitions:
        return 0
    keys = [(p.topic, p.partition) for p in partitions]
    ends = offsets.latest(keys)
    if ends is None:
        return None
    starts = {key: p.offset for key, p in zip(keys, partitions) if p.offset >= 0}
    to_ask = [TopicPartition(p.topic, p.partition) for p in partitions if p.offset < 0 and p.offset != OFFSET_BEGINNING]
    if to_ask:
        try:
            committed = consumer.committed(to_ask, timeout=REPORT_REQUEST_TIMEOUT_S)
        except KafkaException:
            return None
        starts.update(((c.topic, c.partition), c.offset) for c in committed if c.error is None and c.offset >= 0)
    from_earliest = [key for key in keys if key not in starts]
    if from_earliest:
        earliest = offsets.earliest(from_earliest)
        if earliest is None:
            return None
        starts.update(earliest)
    return sum(max(0, end - starts[key]) for key, end in ends.items() if key in starts)


def partition_lag(consumer: Consumer, positions: Sequence[TopicPartition], offsets: BrokerOffsets,
                  not_fetched: Collection[Partition]) -> int | None:
    """Records from each of `positions` (a partition with where it is read on from; a logical offset as in
    `unfetched_lag`) to its end. The end is the consumer's cached one, from its last fetch, except for the
    partitions `not_fetched` (none delivered since their assignment, or paused), whose cached ends stopped moving:
    theirs are asked of the broker, and the cached ones taken only while it does not answer. None when no
    partition's lag is known."""
    asked = [p for p in positions if (p.topic, p.partition) in not_fetched]
    from_broker = unfetched_lag(consumer, asked, offsets) if asked else None
    lag, known = (from_broker, True) if from_broker is not None else (0, False)
    for position in positions:
        if position.offset < 0 or (from_broker is not None and (position.topic, position.partition) in not_fetched):
            continue
        try:
            _low, high = consumer.get_watermark_offsets(position, cached=True)
        except KafkaException:
            continue
        if high >= 0:
            lag += max(high - position.offset, 0)
            known = True
    return lag if known else None
