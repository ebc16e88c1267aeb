"""Settings of the DB connector: topics, consumer group, InfluxDB measurements, batching."""
from __future__ import annotations

from dataclasses import dataclass

from pipeline_core.influx_retention import (DATA_MEASUREMENT, DEADLETTER_MEASUREMENT, JOINED_MEASUREMENT,
                                            RetentionSettings)
from pipeline_core.settings import KafkaSettings, ProgressSettings, setting
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, MACHINE_OUT


@dataclass(frozen=True)
class DbConnectorSettings(KafkaSettings, ProgressSettings, RetentionSettings):
    """Load machine.data and machine.out (and the dead-letter counts of machine.dlq) into InfluxDB, each into
    its retention policy (raw, joined; the policies' durations apply when the connector creates them)."""

    data_topic: str = setting(MACHINE_DATA.name, "DB_CONNECTOR_DATA_TOPIC", "topic of the raw quantities")
    out_topic: str = setting(MACHINE_OUT.name, "DB_CONNECTOR_OUT_TOPIC", "topic of the join results")
    dlq_topic: str = setting(MACHINE_DLQ.name, "DB_CONNECTOR_DLQ_TOPIC",
                             "dead-letter topic: rejected records go there, and its records are counted")
    group_id: str = setting("db-connector", "DB_CONNECTOR_GROUP_ID", "Kafka consumer group")
    group_instance_id: str | None = setting(None, "DB_CONNECTOR_INSTANCE_ID",
                                            "static group membership: a restarted connector with the same id "
                                            "takes its partitions back at once instead of after the session timeout")
    session_timeout_ms: int = setting(10_000, "DB_CONNECTOR_SESSION_TIMEOUT_MS",
                                      "group session timeout: how soon a vanished instance's partitions move to the "
                                      "other instances of the group (Kafka's client default, 45 s, held them that long)")
    data_measurement: str = setting(DATA_MEASUREMENT, "DB_CONNECTOR_DATA_MEASUREMENT", "measurement of the raw quantities")
    joined_measurement: str = setting(JOINED_MEASUREMENT, "DB_CONNECTOR_JOINED_MEASUREMENT", "measurement of the join results")
    deadletter_measurement: str = setting(DEADLETTER_MEASUREMENT, "DB_CONNECTOR_DEADLETTER_MEASUREMENT",
                                          "measurement counting the records of the dead-letter topic")
    batch_size: int = setting(5000, "DB_CONNECTOR_BATCH_SIZE", "points per InfluxDB write", minimum=1)
    flush_interval_s: float = setting(1.0, "DB_CONNECTOR_FLUSH_INTERVAL_S",
                                      "write a partial batch after this many seconds")
    level_thresholds: str = setting("100,1000,5000", "DB_CONNECTOR_LEVEL_THRESHOLDS",
                                    "ascending |result| bounds of the join results' power levels "
                                    "idle/low/medium/high (W); 'active' means above the first")
    retry_max_s: float = setting(30.0, "DB_CONNECTOR_RETRY_MAX_S",
                                 "longest wait between retries while InfluxDB is unreachable")
