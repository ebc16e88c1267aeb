"""Settings of the standalone Kafka joiner: topics, group, transactions and join specs."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from pipeline_core.settings import KafkaSettings, ProgressSettings, setting
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, MACHINE_OUT

from local_stream_buffer.eviction import DEFAULT_MAX_JOIN_KEYS
from local_stream_buffer.two_stream_join import DEFAULT_MAX_PENDING_PER_SIDE


@dataclasses.dataclass(frozen=True)
class KafkaJoinerSettings(KafkaSettings, ProgressSettings):
    """Exactly-once join of machine.data into machine.out, state included, surviving crashes and rebalances."""

    input_topic: str = setting(MACHINE_DATA.name, "KAFKA_JOINER_INPUT_TOPIC", "topic of the measured records")
    output_topic: str = setting(MACHINE_OUT.name, "KAFKA_JOINER_OUTPUT_TOPIC", "topic of the join results")
    dlq_topic: str = setting(MACHINE_DLQ.name, "KAFKA_JOINER_DLQ_TOPIC", "topic of rejected records, with reason")
    group_id: str = setting("kafka-joiner", "KAFKA_JOINER_GROUP_ID",
                            "consumer group; instances of one group share the work")
    input_partitioned_by_thing: bool = setting(
        False, "KAFKA_JOINER_INPUT_PARTITIONED_BY_THING",
        "the input holds every quantity of a thing in one partition (the stream connector writes it so, see "
        "pipeline_core.partitioning): join each partition where it lies, without the repartition hop; a record found "
        "in another partition is dead-lettered")
    repartition_topic: str | None = setting(
        None, "KAFKA_JOINER_REPARTITION_TOPIC",
        "internal topic holding the input co-partitioned by thing (default: <group-id>.<input-topic>.by-thing)")
    state_topic: str | None = setting(
        None, "KAFKA_JOINER_STATE_TOPIC",
        "compacted changelog of the records the joins hold, one partition per co-partitioned partition, created on "
        "start (default: <group-id>.<input-topic>.state, or <repartition topic>.state with input partitioned by key)")
    transactional_id_prefix: str = setting("kafka-joiner", "KAFKA_JOINER_TRANSACTIONAL_ID_PREFIX",
                                           "transactional.id is <prefix>.<instance id>")
    instance_id: str | None = setting(
        None, "KAFKA_JOINER_INSTANCE_ID",
        "stable name of this instance (static group membership, stable transactional.id): a restart with the "
        "same name takes over at once and aborts the crashed run's open transaction; default: random per run")
    join_specs: Path | None = setting(None, "KAFKA_JOINER_JOIN_SPECS",
                                      "join-spec TOML file (default: local_stream_buffer/join_specs.toml)")
    commit_interval_ms: int = setting(100, "KAFKA_JOINER_COMMIT_INTERVAL_MS",
                                      "a transaction commits at least this often while a backlog is read (at once when the input is drained)")
    max_transaction_records: int = setting(50_000, "KAFKA_JOINER_MAX_TRANSACTION_RECORDS",
                                           "a transaction commits early once it consumed this many records", minimum=1)
    transaction_timeout_ms: int = setting(
        10_000, "KAFKA_JOINER_TRANSACTION_TIMEOUT_MS",
        "the broker aborts a crashed instance's open transaction after this (read_committed readers wait)")
    session_timeout_ms: int = setting(10_000, "KAFKA_JOINER_SESSION_TIMEOUT_MS",
                                      "group session timeout: how soon a vanished instance's partitions move")
    max_pending_per_side: int = setting(DEFAULT_MAX_PENDING_PER_SIDE, "KAFKA_JOINER_MAX_PENDING_PER_SIDE",
                                        "pending records per side and key before the oldest are forced (memory bound)")
    max_join_keys: int = setting(
        DEFAULT_MAX_JOIN_KEYS, "KAFKA_JOINER_MAX_JOIN_KEYS",
        "join keys (thing x join spec x axis) per partition; beyond it the least recently used are evicted and "
        "the records they held dead-lettered as evicted (memory bound; 0: no bound)")
    align_ms: int = setting(500, "KAFKA_JOINER_ALIGN_MS",
                            "while catching up a backlog, input partitions more than this far ahead in append time "
                            "pause, so a key's two streams stay close")

    def repartition_topic_name(self) -> str:
        return self.repartition_topic or f"{self.group_id}.{self.input_topic}.by-thing"

    def state_topic_name(self) -> str:
        if self.state_topic:
            return self.state_topic
        if self.input_partitioned_by_thing:
            return f"{self.group_id}.{self.input_topic}.state"
        return f"{self.repartition_topic_name()}.state"
