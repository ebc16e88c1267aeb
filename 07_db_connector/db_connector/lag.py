"""The consumer lag the DB connector reports: records of its assigned partitions not read yet."""
from __future__ import annotations

from confluent_kafka import Consumer, KafkaException

from pipeline_core.broker_offsets import BrokerOffsets
from pipeline_core.consumer_lag import unfetched_lag


def assigned_lag(consumer: Consumer, broker_offsets: BrokerOffsets) -> int | None:
    """Records of the assigned partitions not read yet. Of a partition read from since its assignment: its
    end as the consumer last fetched it (cached) minus its position. Of one not: asked of the broker (see
    `pipeline_core.consumer_lag`), since a partition the consumer does not fetch has a cached end that
    stopped moving. None before it knows any."""
    assignment = consumer.assignment()
    if not assignment:
        return None
    lag, known = 0, False
    unread = []
    for position in consumer.position(assignment):
        if position.offset < 0:
            unread.append(position)
            continue
        try:
            _low, high = consumer.get_watermark_offsets(position, cached=True)
        except KafkaException:
            continue
        if high >= 0:
            lag += max(high - position.offset, 0)
            known = True
    unread_lag = unfetched_lag(consumer, unread, broker_offsets) if unread else None
    if unread_lag is not None:
        lag += unread_lag
        known = True
    return lag if known else None
