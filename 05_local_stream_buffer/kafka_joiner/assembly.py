"""The standalone joiner put together at its start, for the way its input is partitioned.

Its topics first: the co-partitioned topic (unless the input is partitioned by thing already, and so is one), the
changelog with as many partitions, and with input partitioned by thing the handover topic, grown to the input's
count if it has grown since. Then the parts its loop drives: by key, the forwarder that sends each record to its
thing's partition and the alignment of the input's partitions by time; by thing, the follower of a grown input
(`growth`); either way the changelog's restorer, the owned partitions with their joins and the frame joiner.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Consumer

from pipeline_core.broker_offsets import BrokerOffsets
from pipeline_core.consumer_lag import REPORT_REQUEST_TIMEOUT_S
from pipeline_core.data_loss import OffsetWatch
from pipeline_core.kafka_clients import admin_client, security_config
from pipeline_core.records import DLQ_MAX_MESSAGE_BYTES
from pipeline_core.topics import MACHINE_DATA, TopicSpec, dead_letter_limit, ensure_topics, partition_count

from local_stream_buffer.keyed import KeyedJoiner
from local_stream_buffer.spec_changes import fingerprints
from local_stream_buffer.specs import SpecResolver
from .alignment import InputAlignment
from .changelog import STATE_TOPIC_CONFIG, Restorer
from .growth import GrowthFollower, grow_internal
from .handover import HANDOVER_TOPIC_CONFIG, Handover, handover_topic_name
from .partition_join import FrameJoiner
from .progress import JoinerStats
from .rebalance import OwnedPartitions
from .repartition import Forwarder, InputFrames, ThingRouter, repartitioned_frame
from .settings import KafkaJoinerSettings
from .transaction import Transaction


@dataclass
class JoinerParts:
    """What the joiner's loop drives; `forwarder` and `alignment` with input partitioned by key, `growth` by thing."""

    restorer: Restorer
    partitions: OwnedPartitions
    frames: FrameJoiner
    forwarder: Forwarder | None = None
    alignment: InputAlignment | None = None
    growth: GrowthFollower | None = None


def prepare_topics(admin, settings: KafkaJoinerSettings, join_topic: str, state_topic: str, by_thing: bool,
                   deadline_s: float) -> int:
    """Create the joiner's topics where missing (see the module doc); returns the partition count of `join_topic`,
    which the changelog (and the handover topic) must match."""
    input_partitions = partition_count(admin, settings.input_topic, deadline_s)
    if by_thing:
        join_partitions = input_partitions
    else:
        # Frames of records as large as the input's limit: the topic takes what the producer sends.
        ensure_topics(admin, (TopicSpec(join_topic, input_partitions, {
            **MACHINE_DATA.config, "max.message.bytes": str(DLQ_MAX_MESSAGE_BYTES)}),), deadline_s=deadline_s)
        join_partitions = partition_count(admin, join_topic, deadline_s)  # an existing topic may differ
    ensure_topics(admin, (TopicSpec(state_topic, join_partitions, STATE_TOPIC_CONFIG),), deadline_s=deadline_s)
    state_partitions = partition_count(admin, state_topic, deadline_s)
    internal = (state_topic, handover_topic_name(state_topic))
    if state_partitions < join_partitions and by_thing:
        state_partitions = grow_internal(admin, internal, join_topic, join_partitions, deadline_s)
    if state_partitions != join_partitions:
        raise SystemExit(f"state topic {state_topic} has {state_partitions} partitions, {join_topic} "
                         f"{join_partitions}: they must match (see --state-topic)")
    if by_thing:
        ensure_topics(admin, (TopicSpec(internal[1], join_partitions, HANDOVER_TOPIC_CONFIG),), deadline_s=deadline_s)
        if partition_count(admin, internal[1], deadline_s) < join_partitions:
            grow_internal(admin, internal, join_topic, join_partitions, deadline_s)
    return join_partitions


def assemble(settings: KafkaJoinerSettings, resolver: SpecResolver, stats: JoinerStats, consumer: Consumer,
             transaction: Transaction, watch: OffsetWatch, commit: Callable[[], bool], *, join_topic: str,
             state_topic: str, by_thing: bool) -> JoinerParts:
    """The joiner's topics prepared (`prepare_topics`) and its parts made; `commit` is the joiner's own."""
    security = security_config(settings)
    admin = admin_client(settings.kafka_bootstrap_servers, **security)
    deadline_s = settings.kafka_startup_deadline_s
    join_partitions = prepare_topics(admin, settings, join_topic, state_topic, by_thing, deadline_s)
    router = ThingRouter(resolver, join_partitions)
    forwarder = alignment = None
    if by_thing:
        frame_of = InputFrames(router, stats).frame
    else:
        frame_of = repartitioned_frame
        forwarder = Forwarder(settings.input_topic, router, stats)
        alignment = InputAlignment(consumer, settings.input_topic, settings.align_ms, forwarder.positions,
                                   forwarder.append_times, lambda: partitions.starts())
    restorer = Restorer(settings.kafka_bootstrap_servers, settings.group_id, state_topic, security)
    partitions = OwnedPartitions(
        consumer, join_topic,
        lambda on_release, on_evict, on_dead_letter, specs=None: KeyedJoiner(
            resolver if specs is None else SpecResolver(specs),
            max_pending_per_side=settings.max_pending_per_side, on_release=on_release,
            max_join_keys=settings.max_join_keys or None, on_evict=on_evict, on_dead_letter=on_dead_letter),
        restorer, stats, forwarder, alignment, watch,
        broker_offsets=BrokerOffsets(settings.kafka_bootstrap_servers, REPORT_REQUEST_TIMEOUT_S, security=security),
        specs=fingerprints(resolver.specs))
    frames = FrameJoiner(transaction, stats, settings.input_topic, settings.output_topic, settings.dlq_topic, frame_of,
                         join_partitions, dead_letter_limit(admin, settings.dlq_topic, deadline_s))
    growth = None
    if by_thing:
        growth = GrowthFollower(
            Handover(settings.kafka_bootstrap_servers, settings.group_id, handover_topic_name(state_topic),
                     settings.input_topic, resolver.joinable_thing, security),
            admin=admin, consumer=consumer, transaction=transaction, commit=commit, partitions=partitions,
            frames=frames, restorer=restorer, join_topic=join_topic, state_topic=state_topic,
            join_partitions=join_partitions, deadline_s=deadline_s)
    return JoinerParts(restorer, partitions, frames, forwarder, alignment, growth)
