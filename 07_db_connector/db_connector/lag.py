"""The consumer lag the DB connector reports: records of its assigned partitions not read yet."""
from __future__ import annotations

from confluent_kafka import Consumer

from pipeline_core.broker_offsets import BrokerOffsets
from pipeline_core.consumer_lag import partition_lag


def assigned_lag(consumer: Consumer, broker_offsets: BrokerOffsets, *, fetch_paused: bool) -> int | None:
    """Records of the assigned partitions not read yet, from each one's position to its end; None before it knows
    any. The ends of partitions the consumer does not fetch are asked of the broker (`partition_lag`): those it
    delivered nothing of since their assignment, and every one while fetching is paused (`fetch_paused`: the loop
    waits for the sink), since a backlog growing behind an outage of the sink would otherwise show as none."""
    assignment = consumer.assignment()
    if not assignment:
        return None
    positions = consumer.position(assignment)
    not_fetched = {(p.topic, p.partition) for p in positions if fetch_paused or p.offset < 0}
    return partition_lag(consumer, positions, broker_offsets, not_fetched)
