"""Settings of the MQTT -> Kafka stream connector (flags > environment > defaults)."""
from __future__ import annotations

from dataclasses import dataclass

from pipeline_core.mqtt import CONNECTOR_CLIENT_ID, CONNECTOR_TOPIC_FILTER
from pipeline_core.settings import KafkaSettings, MqttSettings, ProgressSettings, setting
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ
from pipeline_core.validation import DEFAULT_MAX_QUANTITIES, DEFAULT_MAX_ROW_BYTES


@dataclass(frozen=True)
class ConnectorSettings(MqttSettings, KafkaSettings, ProgressSettings):
    """Bridge machine-state rows from MQTT into one Kafka record per quantity."""

    topic_filters: str = setting(CONNECTOR_TOPIC_FILTER, "STREAM_CONNECTOR_TOPIC_FILTERS",
                                 "MQTT topic filters to subscribe to, comma-separated; several instances share the "
                                 "input by taking disjoint filters that together cover machine/states/# (README, "
                                 "\"Several instances\")")
    # The variables' former names (before every one started with the stage's name) are still read, with a warning.
    mqtt_client_id: str = setting(CONNECTOR_CLIENT_ID, "STREAM_CONNECTOR_CLIENT_ID",
                                  "MQTT client id; fixed, so the broker keeps the session across restarts; one of "
                                  "its own per instance (stream-connector-<shard>)",
                                  formerly=(None, "CONNECTOR_CLIENT_ID"))
    data_topic: str = setting(MACHINE_DATA.name, "STREAM_CONNECTOR_DATA_TOPIC", "Kafka topic for the records",
                              formerly=(None, "DATA_TOPIC"))
    dlq_topic: str = setting(MACHINE_DLQ.name, "STREAM_CONNECTOR_DLQ_TOPIC", "Kafka topic for rejected input",
                             formerly=(None, "DLQ_TOPIC"))
    max_payload_bytes: int = setting(DEFAULT_MAX_ROW_BYTES, "STREAM_CONNECTOR_MAX_PAYLOAD_BYTES",
                                     "larger rows are dead-lettered unread", minimum=1,
                                     formerly=(None, "CONNECTOR_MAX_PAYLOAD_BYTES"))
    max_quantities: int = setting(DEFAULT_MAX_QUANTITIES, "STREAM_CONNECTOR_MAX_QUANTITIES",
                                  "rows with more quantities are dead-lettered whole", minimum=1,
                                  formerly=(None, "CONNECTOR_MAX_QUANTITIES"))
    delivery_timeout_ms: int = setting(0, "STREAM_CONNECTOR_DELIVERY_TIMEOUT_MS",
                                       "how long Kafka may take to confirm a record before the connector starts "
                                       "its Kafka client afresh and the broker sends the unacknowledged rows again; "
                                       "0: wait without end, the client retrying in order and without duplicates",
                                       formerly=(None, "CONNECTOR_DELIVERY_TIMEOUT_MS"))
    redelivery_window_records: int = setting(
        100_000, "STREAM_CONNECTOR_REDELIVERY_WINDOW_RECORDS",
        "records Kafka confirmed lately, per partition at start, that a row the broker sends again is checked "
        "against, so it is not written twice; above the broker's window of unacknowledged rows (100) times "
        "a row's quantities", formerly=(None, "CONNECTOR_REDELIVERY_WINDOW_RECORDS"))
    linger_ms: int = setting(5, "STREAM_CONNECTOR_LINGER_MS", "Kafka producer linger (batching delay)",
                             formerly=(None, "CONNECTOR_LINGER_MS"))
    joiner_groups: str = setting(
        "kafka-joiner", "STREAM_CONNECTOR_JOINER_GROUPS",
        "consumer groups of the joiners, comma-separated: after the data topic grew, records are placed by its new "
        "partition count once each of these that has a position in the topic has read every record placed by the "
        "old one (README, \"Partitions added\")")
    partition_check_interval_s: float = setting(10.0, "STREAM_CONNECTOR_PARTITION_CHECK_INTERVAL_S",
                                                "how often the data topic's partition count is read")
    switch_max_pause_s: float = setting(
        10.0, "STREAM_CONNECTOR_SWITCH_MAX_PAUSE_S",
        "how long new rows are held (unacknowledged) while the joiners read what was placed by the old partition "
        "count; past it they are placed by the old count, and the switch is tried again later")
    switch_retry_s: float = setting(30.0, "STREAM_CONNECTOR_SWITCH_RETRY_S",
                                    "the pause before a switch to a grown topic's partition count is tried again")
    shutdown_timeout_s: float = setting(30.0, "STREAM_CONNECTOR_SHUTDOWN_TIMEOUT_S",
                                        "how long SIGTERM waits for Kafka to confirm what is in flight",
                                        formerly=(None, "CONNECTOR_SHUTDOWN_TIMEOUT_S"))
