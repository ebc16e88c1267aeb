"""The pipeline's Kafka topics and their idempotent creation."""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType

from .kafka_clients import DEFAULT_STARTUP_DEADLINE_S, retry_transient
from .records import DEAD_LETTER_MAX_BYTES, DEAD_LETTER_ROOM_BYTES, DLQ_MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

TWO_DAYS_MS = str(2 * 24 * 3600 * 1000)
GIB = 1024**3

# `delete`, not `compact`: keys are "thing.quantity", so compaction would keep only the latest value
# of each quantity and erase the time series that joins, restarts and dashboards read back.
_TIME_SERIES = {"cleanup.policy": "delete", "retention.ms": TWO_DAYS_MS}


def _retention_bytes(env: str, default: int) -> dict[str, str]:
    """A partition's size bound (retention.bytes), whichever of it and retention.ms is reached first deletes
    the oldest segment. `env` overrides the default; -1 means no bound by size."""
    value = os.environ.get(env, str(default))
    try:
        int(value)
    except ValueError:
        raise SystemExit(f"{env}={value!r}: give the bytes per partition as a whole number (-1: no bound)") from None
    return {"retention.bytes": value}


# Per partition, so the topics hold at most 10 GiB, 3 GiB and 1.5 GiB (plus a segment each). Two days of
# machine.data at 500 records/s (some 250 bytes each on disk) are about 20 GiB: a plant that fast keeps
# about a day, a slower one the full two days; either way Kafka stops growing before a disk of a few tens of
# GiB fills. What size deletes is counted as loss as retention by time is (the log start offset moves).
DATA_RETENTION_BYTES = 2 * GIB
OUT_RETENTION_BYTES = 1 * GIB
DLQ_RETENTION_BYTES = GIB // 2


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)


MACHINE_DATA = TopicSpec("machine.data", 5, {**_TIME_SERIES,
                                              **_retention_bytes("KAFKA_DATA_RETENTION_BYTES", DATA_RETENTION_BYTES)})
MACHINE_OUT = TopicSpec("machine.out", 3, {**_TIME_SERIES,
                                           **_retention_bytes("KAFKA_OUT_RETENTION_BYTES", OUT_RETENTION_BYTES)})
MACHINE_DLQ = TopicSpec("machine.dlq", 3, {**_TIME_SERIES, "max.message.bytes": str(DLQ_MAX_MESSAGE_BYTES),
                                           **_retention_bytes("KAFKA_DLQ_RETENTION_BYTES", DLQ_RETENTION_BYTES)})
# The settings `ensure_topics` brings an existing topic to: a changed size bound applies on the next `up`.
ALTERED_ON_START = ("retention.bytes",)
PIPELINE_TOPICS = (MACHINE_DATA, MACHINE_OUT, MACHINE_DLQ)

# The variables naming each stage's topics, per role: its settings' environment variables (a former name after
# the current one). The stack creates every topic they name (`configured_topics`) and grants each stage's Kafka
# user its own (ops/stack/kafka_acls.py), so a stage given other topic names finds them made and its own.
STAGE_TOPIC_VARIABLES: dict[str, dict[str, tuple[str, ...]]] = {
    "stream-connector": {"data": ("STREAM_CONNECTOR_DATA_TOPIC", "DATA_TOPIC"),
                         "dlq": ("STREAM_CONNECTOR_DLQ_TOPIC", "DLQ_TOPIC")},
    "lsb-joiner": {"data": ("KAFKA_JOINER_INPUT_TOPIC",), "out": ("KAFKA_JOINER_OUTPUT_TOPIC",),
                   "dlq": ("KAFKA_JOINER_DLQ_TOPIC",)},
    "spark-joiner": {"data": ("SPARK_JOINER_INPUT_TOPIC",), "out": ("SPARK_JOINER_OUTPUT_TOPIC",),
                     "dlq": ("SPARK_JOINER_DLQ_TOPIC",)},
    "db-connector": {"data": ("DB_CONNECTOR_DATA_TOPIC",), "out": ("DB_CONNECTOR_OUT_TOPIC",),
                     "dlq": ("DB_CONNECTOR_DLQ_TOPIC",)},
}
ROLE_TOPICS = {"data": MACHINE_DATA, "out": MACHINE_OUT, "dlq": MACHINE_DLQ}


def stage_topics(stage: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The topic `stage` uses for each of its roles (data, out, dlq), as its settings read them from `environ`
    (default: this process's): the first variable set and not empty, else the pipeline's topic."""
    environ = os.environ if environ is None else environ
    return {role: next((environ[name] for name in names if environ.get(name)), ROLE_TOPICS[role].name)
            for role, names in STAGE_TOPIC_VARIABLES[stage].items()}


def configured_topics(environ: Mapping[str, str] | None = None) -> tuple[TopicSpec, ...]:
    """Every topic some stage is set to use, each with its role's partitions and configuration; the pipeline's
    three when no variable names another."""
    specs: dict[str, TopicSpec] = {}
    for stage in STAGE_TOPIC_VARIABLES:
        for role, name in stage_topics(stage, environ).items():
            specs.setdefault(name, replace(ROLE_TOPICS[role], name=name))
    return tuple(specs.values())


# The broker's own default.replication.factor (and min.insync.replicas): 1 on the single broker, 3 (and 2) on
# the three-node cluster (04_kafka/cluster-node.properties), so every topic a stage or tool creates is
# replicated as its cluster is. KAFKA_REPLICATION_FACTOR / KAFKA_MIN_INSYNC_REPLICAS set them per topic instead.
BROKER_DEFAULT = -1


def replication(environ: Mapping[str, str] | None = None) -> tuple[int, dict[str, str]]:
    """The replication factor new topics get, and the topic config that sets their min.insync.replicas
    (empty: the broker's default)."""
    environ = os.environ if environ is None else environ
    factor = int(environ.get("KAFKA_REPLICATION_FACTOR") or BROKER_DEFAULT)
    min_insync = environ.get("KAFKA_MIN_INSYNC_REPLICAS")
    return factor, ({"min.insync.replicas": str(int(min_insync))} if min_insync else {})


def ensure_topics(admin: AdminClient, topics: tuple[TopicSpec, ...] = PIPELINE_TOPICS,
                  timeout: float = 30.0, deadline_s: float = DEFAULT_STARTUP_DEADLINE_S) -> list[str]:
    """Create the topics that do not exist yet, and set `ALTERED_ON_START` on those that do; returns the
    names created. Safe to call twice, and asks again while the broker answers a transient error (up to
    `deadline_s`)."""
    created: list[str] = []
    factor, min_insync = replication()

    def create_missing() -> None:
        existing = admin.list_topics(timeout=timeout).topics
        _alter_existing(admin, [t for t in topics if t.name in existing], timeout)
        wanted = [NewTopic(t.name, num_partitions=t.partitions, replication_factor=factor,
                           config={**min_insync, **t.config})
                  for t in topics if t.name not in existing]
        for name, future in (admin.create_topics(wanted, operation_timeout=timeout).items() if wanted else ()):
            try:
                future.result(timeout)
                created.append(name)
            except KafkaException as error:
                if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # a concurrent creator won
                    raise

    retry_transient(create_missing, what=f"creating topics {', '.join(t.name for t in topics)}",
                    deadline_s=deadline_s)
    if created:
        log.info("created topics %s", ", ".join(created))
    return created


def _alter_existing(admin: AdminClient, topics: list[TopicSpec], timeout: float) -> None:
    resources = [ConfigResource(ResourceType.TOPIC, topic.name, incremental_configs=[
        ConfigEntry(key, topic.config[key], incremental_operation=AlterConfigOpType.SET)
        for key in ALTERED_ON_START if key in topic.config]) for topic in topics]
    resources = [resource for resource in resources if resource.incremental_configs]
    answers = admin.incremental_alter_configs(resources, request_timeout=timeout) if resources else {}
    for resource, future in answers.items():
        try:
            future.result(timeout)
        except KafkaException as error:
            # A stage of a secure stack may not alter topics (only the admin may): `make up` and
            # `python -m stack topics`, as the admin, keep their settings current.
            if error.args[0].code() != KafkaError.TOPIC_AUTHORIZATION_FAILED:
                raise
            log.info("not allowed to set %s on topic %s; leaving it to the admin", ", ".join(ALTERED_ON_START),
                     resource.name)


def partition_count(admin: AdminClient, topic: str, deadline_s: float = DEFAULT_STARTUP_DEADLINE_S) -> int:
    """Partitions of `topic`, asking again while it is unknown or leaderless (a just created topic reaches
    the broker's metadata cache shortly) or the broker answers another transient error."""

    def count() -> int:
        metadata = admin.list_topics(topic, timeout=min(30.0, deadline_s)).topics.get(topic)
        if metadata is None:
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, f"topic {topic} is not in the metadata"))
        if metadata.error is not None:
            raise KafkaException(metadata.error)
        if not metadata.partitions:
            raise KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE, f"topic {topic} has no partitions yet"))
        return len(metadata.partitions)

    return retry_transient(count, what=f"reading the partitions of topic {topic}", deadline_s=deadline_s)


def dead_letter_limit(admin: AdminClient, dlq_topic: str, deadline_s: float = DEFAULT_STARTUP_DEADLINE_S) -> int:
    """The largest dead letter `dlq_topic` takes: its max.message.bytes less room for a record's key, headers
    and framing, at most `DEAD_LETTER_MAX_BYTES` (what the pipeline's own machine.dlq takes). A stage whose
    letters commit in a transaction sizes them by this, since a letter the broker refused would abort the
    transaction again on every try. A topic not there yet, or no right to read its configuration: the default."""
    resource = ConfigResource(ResourceType.TOPIC, dlq_topic)

    def read() -> int | None:
        try:
            configs = admin.describe_configs([resource], request_timeout=min(30.0, deadline_s))[resource].result()
        except KafkaException as error:
            if error.args[0].code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC,
                                        KafkaError.TOPIC_AUTHORIZATION_FAILED):
                log.info("cannot read the max.message.bytes of %s (%s): dead letters are kept under %d bytes",
                         dlq_topic, error.args[0].str(), DEAD_LETTER_MAX_BYTES)
                return None
            raise
        return int(configs["max.message.bytes"].value)

    topic_limit = retry_transient(read, what=f"reading the max.message.bytes of topic {dlq_topic}",
                                  deadline_s=deadline_s)
    if topic_limit is None:
        return DEAD_LETTER_MAX_BYTES
    return max(min(DEAD_LETTER_MAX_BYTES, topic_limit - DEAD_LETTER_ROOM_BYTES), topic_limit // 2)
