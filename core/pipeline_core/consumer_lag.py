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

from collections.abc import Sequence

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

# How long a progress report waits for each request of `unfetched_lag`: while Kafka is away, the stage's loop
# stalls this long at most per request, up to three per report.
REPORT_REQUEST_TIMEOUT_S = 1.0
# The timestamps ListOffsets takes for a partition's end and its earliest offset (offsets_for_times).
_LATEST_TIMESTAMP = -1
_EARLIEST_TIMESTAMP = -2


def unfetched_lag(consumer: Consumer, partitions: Sequence[TopicPartition], timeout_s: float) -> int | None:
    """Records of the assigned `partitions` (none delivered since their assignment) from where the stage's
    consumer starts reading each to its end, asked of the broker. A partition's offset is that start; a logical
    one means the group's committed offset (OFFSET_BEGINNING: the earliest offset, as a partition without a
    committed offset starts too). One request for the ends, one for the committed offsets and one for the
    earliest offsets where needed; None when the broker does not answer one within `timeout_s`.

    `consumer` is of the stage's group, and best one that does not fetch: on a fetching consumer each request
    waits behind the fetch in flight to the same broker, up to its fetch.wait.max.ms."""
    if not partitions:
        return 0
    starts = {(p.topic, p.partition): p.offset for p in partitions if p.offset >= 0}
    try:
        ends = _offsets_at(consumer, partitions, _LATEST_TIMESTAMP, timeout_s)
        to_ask = [TopicPartition(p.topic, p.partition) for p in partitions
                  if p.offset < 0 and p.offset != OFFSET_BEGINNING]
        for committed in consumer.committed(to_ask, timeout=timeout_s) if to_ask else ():
            if committed.error is None and committed.offset >= 0:
                starts[(committed.topic, committed.partition)] = committed.offset
        from_earliest = [p for p in partitions if (p.topic, p.partition) not in starts]
        if from_earliest:
            starts.update(_offsets_at(consumer, from_earliest, _EARLIEST_TIMESTAMP, timeout_s))
    except KafkaException:
        return None
    return sum(max(0, end - starts[key]) for key, end in ends.items() if key in starts)


def _offsets_at(consumer: Consumer, partitions: Sequence[TopicPartition], timestamp: int,
                timeout_s: float) -> dict[tuple[str, int], int]:
    answered = consumer.offsets_for_times([TopicPartition(p.topic, p.partition, timestamp) for p in partitions],
                                          timeout=timeout_s)
    return {(p.topic, p.partition): p.offset for p in answered if p.error is None and p.offset >= 0}
