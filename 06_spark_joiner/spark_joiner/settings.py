"""The Spark joiner's settings: command-line flags over environment variables over defaults."""
from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from local_stream_buffer import DEFAULT_MAX_PENDING_PER_SIDE
from local_stream_buffer.eviction import DEFAULT_MAX_JOIN_KEYS
from pipeline_core.paths import STATE_DIR
from pipeline_core.settings import KafkaSettings, ProgressSettings, setting
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, MACHINE_OUT

DEFAULT_CHECKPOINT_DIR = STATE_DIR / "spark_joiner" / "checkpoint"
# Spark pays per state partition and per bucket in every micro-batch, input or not (a task and its state store's
# load and commit per partition, a Python call and its state calls per bucket): the defaults are what one
# machine's cores need, and the least of both fixed costs (latency in docs/benchmarks.md). A cluster sets more.
DEFAULT_SHUFFLE_PARTITIONS = 2
DEFAULT_BUCKETS = 16
# Per bucket: the engine's bound of 20,000 keys times four keeps the bound of the former 64 buckets in 16.
DEFAULT_MAX_JOIN_KEYS_PER_BUCKET = 4 * DEFAULT_MAX_JOIN_KEYS


@dataclasses.dataclass(frozen=True)
class SparkJoinerSettings(KafkaSettings, ProgressSettings):
    """machine.data -> deterministic join in Spark's keyed state -> machine.out, exactly once."""

    input_topic: str = setting(MACHINE_DATA.name, "SPARK_JOINER_INPUT_TOPIC", "topic with the machine records")
    output_topic: str = setting(MACHINE_OUT.name, "SPARK_JOINER_OUTPUT_TOPIC", "topic for the join results")
    dlq_topic: str = setting(MACHINE_DLQ.name, "SPARK_JOINER_DLQ_TOPIC", "topic for rejected records")
    join_specs: Path | None = setting(None, "SPARK_JOINER_JOIN_SPECS",
                                      "join-spec file (default: the engine's join_specs.toml)")
    master: str = setting("local[*]", "SPARK_JOINER_MASTER",
                          "Spark master: local[*], local-cluster[2,1,1024], spark://host:7077, k8s://...")
    checkpoint_dir: Path = setting(DEFAULT_CHECKPOINT_DIR, "SPARK_JOINER_CHECKPOINT_DIR",
                                   "Structured Streaming checkpoint (offsets, join state); a restart resumes it")
    trigger_s: float = setting(0.25, "SPARK_JOINER_TRIGGER_S", "micro-batch trigger interval in seconds (0: as fast as "
                               "possible)", formerly=("--trigger-seconds", "SPARK_JOINER_TRIGGER_SECONDS"))
    max_offsets_per_trigger: int = setting(500_000, "SPARK_JOINER_MAX_OFFSETS_PER_TRIGGER",
                                           "most input records per micro-batch (0: no limit)")
    shuffle_partitions: int = setting(DEFAULT_SHUFFLE_PARTITIONS, "SPARK_JOINER_SHUFFLE_PARTITIONS",
                                      "state partitions; a change starts a new checkpoint, which rebuilds the state "
                                      "from the input (see the README)", minimum=1)
    buckets: int = setting(DEFAULT_BUCKETS, "SPARK_JOINER_BUCKETS",
                           "hash buckets the join keys are grouped into (one Spark group each); a change starts "
                           "a new checkpoint, which rebuilds the state from the input (see the README)", minimum=1)
    max_pending_per_side: int = setting(DEFAULT_MAX_PENDING_PER_SIDE, "SPARK_JOINER_MAX_PENDING_PER_SIDE",
                                        "pending records per side and key before the oldest are forced")
    max_join_keys: int = setting(DEFAULT_MAX_JOIN_KEYS_PER_BUCKET, "SPARK_JOINER_MAX_JOIN_KEYS",
                                 "join keys (thing x join spec x axis) per bucket; beyond it the least recently used "
                                 "are evicted and the records they held dead-lettered as evicted (0: no bound)")
    transactional_id: str | None = setting(None, "SPARK_JOINER_TRANSACTIONAL_ID",
                                           "Kafka transactional id of the sink (default: derived from the "
                                           "checkpoint directory, so a restart fences its predecessor)")
    kafka_transaction_timeout_s: float = setting(60.0, "SPARK_JOINER_KAFKA_TRANSACTION_TIMEOUT_S",
                                                 "seconds a batch's transaction waits for Kafka before it fails; the "
                                                 "query then restarts with a new producer, which waits up to "
                                                 "KAFKA_STARTUP_DEADLINE_S before the process exits to be restarted")
    max_query_restarts: int = setting(5, "SPARK_JOINER_MAX_QUERY_RESTARTS",
                                      "times a failed query is restarted from the checkpoint before the process "
                                      "exits with an error")
    driver_memory: str = setting("1g", "SPARK_JOINER_DRIVER_MEMORY", "Spark driver memory")

    def sink_transactional_id(self) -> str:
        """One id per job: the checkpoint is the job's identity, so it names the sink too."""
        if self.transactional_id:
            return self.transactional_id
        digest = hashlib.sha1(str(Path(self.checkpoint_dir).resolve()).encode()).hexdigest()[:12]
        return f"spark-joiner.{digest}"
