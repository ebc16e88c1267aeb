"""`python -m stack grow TOPIC PARTITIONS` (`make grow`): add partitions to a topic of the running stack, and follow
the pipeline until it runs on them.

Kafka only adds partitions, by the admin API (what `kafka-topics --alter --partitions` does); the stack survives
that done by any tool (docs/operations.md, "Partitions added"). This command does the same, as the admin, and then
says what followed, with the time each step took:

* machine.data: the standalone joiner's internal topics (its changelog and handover topic) grown with it, at once
  here, as the joiner also grows them when it is handed the new partitions; then the stream connector's switch to the
  new count (its placement record in Kafka names it: `stream_connector.partition_switch`), once the joiner has read
  what was placed by the old count;
* machine.out and machine.dlq: the DB connectors read the new partitions once their group is rebalanced (within
  their metadata refresh, 10 s), the writers write to them after theirs (at most 5 minutes);
* every stage of the stack healthy with no lag left, or what is not.

A count below the topic's is refused before anything changes: Kafka cannot take partitions away.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pipeline_core.mqtt import CONNECTOR_CLIENT_ID
from pipeline_core.stage_health import read_heartbeat
from pipeline_core.topics import stage_topics
from . import joiners, manager
from .processes import StackError
from .services import PipelineProcess

# How long the command follows the pipeline after the growth before it says what is still not done.
FOLLOW_DEADLINE_S = 300.0
REQUEST_TIMEOUT_S = 30.0
# The stream connector's placement record names the counts it placed by (stream_connector.partition_switch).
PLACEMENT_GROUP = f"{CONNECTOR_CLIENT_ID}.partitioning"
# Records a stage may have waiting and still count as caught up: what arrives between two of its reports.
CAUGHT_UP_LAG = 1_000


@dataclass
class Growth:
    """What `grow` did, each step with seconds after the topic grew."""

    topic: str
    before: int
    after: int
    internal: dict[str, tuple[int, int]] = field(default_factory=dict)  # topic -> (before, after)
    placed_by_new_count_s: float | None = None
    caught_up_s: float | None = None
    not_caught_up: list[str] = field(default_factory=list)


def grow(topic: str, partitions: int, bootstrap_servers: str, security: Mapping[str, str], cluster: bool,
         notify: Callable[[str], None] = print, deadline_s: float = FOLLOW_DEADLINE_S) -> Growth:
    """Grow `topic` to `partitions` partitions and follow the pipeline (see the module doc)."""
    from pipeline_core.kafka_clients import admin_client
    admin = admin_client(bootstrap_servers, log_level=4, **security)  # no notice per topic grown: this says it
    topics = admin.list_topics(timeout=REQUEST_TIMEOUT_S).topics
    if topic not in topics:
        known = sorted(name for name in topics if not name.startswith("__"))
        raise StackError(f"there is no topic {topic!r} on this stack's Kafka; its topics: {', '.join(known)}")
    before = len(topics[topic].partitions)
    if partitions < before:
        raise StackError(f"{topic} has {before} partitions: Kafka cannot take partitions away (a topic with fewer "
                         f"is a new topic, and its records would be lost); nothing was changed")
    if partitions == before:
        raise StackError(f"{topic} has {partitions} partitions already: nothing to do")
    growth = Growth(topic, before, partitions)
    data_topic = stage_topics("stream-connector")["data"]
    if topic == data_topic:
        lsb = joiners.position_of("lsb", cluster)
        for internal in (lsb.state_topic, f"{lsb.state_topic.removesuffix('.state')}.handover"):
            if internal in topics and len(topics[internal].partitions) < partitions:
                growth.internal[internal] = (len(topics[internal].partitions), partitions)
    for name in growth.internal:
        _add_partitions(admin, name, partitions)
    began = time.monotonic()
    _add_partitions(admin, topic, partitions)
    notify(f"{topic}: {before} -> {partitions} partitions" + "".join(
        f"; {name} (the standalone joiner's): {old} -> {new}" for name, (old, new) in growth.internal.items()))
    end = began + deadline_s
    if topic == data_topic:
        growth.placed_by_new_count_s = _await_placement(bootstrap_servers, security, topic, partitions, began, end)
        notify(f"stream connector: places records by {partitions} partitions, {growth.placed_by_new_count_s:.1f} s "
               "after the growth (the joiner had read every record it placed by "
               f"{before})" if growth.placed_by_new_count_s is not None else
               f"stream connector: still places records by {before} partitions after {deadline_s:.0f} s: the joiner "
               "has not read what was placed by them (`make status` says why; it tries again every 30 s)")
    else:
        notify("the joiners write to the new partitions after their next metadata refresh (at most 5 minutes), the "
               "DB connectors read them once their group has them (within 10 s)")
    since = time.time() - (time.monotonic() - began) + (growth.placed_by_new_count_s or 0.0)
    growth.caught_up_s, growth.not_caught_up = _await_caught_up(began, end, since)
    notify(f"every stage healthy and caught up {growth.caught_up_s:.1f} s after the growth"
           if growth.caught_up_s is not None else
           f"not caught up after {deadline_s:.0f} s: {'; '.join(growth.not_caught_up)}")
    return growth


def _add_partitions(admin, topic: str, partitions: int) -> None:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewPartitions
    (future,) = admin.create_partitions([NewPartitions(topic, partitions)],
                                        request_timeout=REQUEST_TIMEOUT_S).values()
    try:
        future.result()
    except KafkaException as error:
        if error.args[0].code() != KafkaError.INVALID_PARTITIONS:  # grown already (by the joiner, say)
            raise
    end = time.monotonic() + REQUEST_TIMEOUT_S
    while len(admin.list_topics(topic, timeout=REQUEST_TIMEOUT_S).topics[topic].partitions) < partitions:
        if time.monotonic() > end:
            raise StackError(f"{topic} was grown to {partitions} partitions, but Kafka does not show them after "
                             f"{REQUEST_TIMEOUT_S:.0f} s")
        time.sleep(0.2)


def _await_placement(bootstrap_servers: str, security: Mapping[str, str], topic: str, partitions: int,
                     began: float, end: float) -> float | None:
    """Seconds from the growth until the stream connector's placement record names `partitions`; None at `end`."""
    from pipeline_core import group_offsets
    client = group_offsets.group_client(bootstrap_servers, PLACEMENT_GROUP, security)
    try:
        while time.monotonic() < end:
            position = group_offsets.committed(client, topic, 1).get(0)
            counts = (position.metadata or "").split(",") if position is not None else []
            if counts and counts[-1] == str(partitions):
                return time.monotonic() - began
            time.sleep(0.2)
    finally:
        client.close()
    return None


def _await_caught_up(began: float, end: float, since: float) -> tuple[float | None, list[str]]:
    """Seconds from the growth until every process of the stack is healthy and every stage has reported, after
    `since` (Unix time), at most `CAUGHT_UP_LAG` records waiting; else None and what is not."""
    lagging: list[str] = []
    services = {service.name: service for service in manager.all_services()}
    while time.monotonic() < end:
        lagging = []
        for entry in manager.status(services.values()):
            service = services[entry.name]
            heartbeat = read_heartbeat(service.progress_file) if isinstance(service, PipelineProcess) else None
            if not entry.healthy:
                lagging.append(f"{entry.name}: {entry.stage.state if entry.stage else entry.state}")
            elif heartbeat is not None and (heartbeat.reported_at < since or (heartbeat.lag or 0) > CAUGHT_UP_LAG):
                lagging.append(f"{entry.name}: lag {heartbeat.lag if heartbeat.lag is not None else '?'}"
                               + (" (no report since)" if heartbeat.reported_at < since else ""))
        if not lagging:
            return time.monotonic() - began, []
        time.sleep(1.0)
    return None, lagging
