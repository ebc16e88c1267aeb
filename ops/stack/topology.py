"""Which stack `python -m stack` runs: TOPOLOGY=single (the default: one Kafka broker, the joiner in one
process) or cluster (three Kafka nodes with replication factor 3, a Spark standalone master and two workers, and
every scaled stage as two instances), and the services of the cluster.

The state dir records the topology its `up` last ran, so `status`, `logs` and `down` without TOPOLOGY act on what
runs; `clean` deletes the record with the rest."""
from __future__ import annotations

import os

from pipeline_core import paths
from . import kafka_cluster, spark_cluster
from .processes import StackError
from .services import InfluxDB, Mosquitto, PipelineProcess, Service

SINGLE = "single"
CLUSTER = "cluster"
TOPOLOGIES = (SINGLE, CLUSTER)
# Instances of each scaled stage on the cluster: one group, distinct instance ids.
INSTANCES = (1, 2)


def _record():
    return paths.STATE_DIR / "topology"


def recorded() -> str | None:
    """The topology this state dir's `up` last ran, if any."""
    try:
        return _record().read_text().strip() or None
    except FileNotFoundError:
        return None


def current() -> str:
    """TOPOLOGY from the environment, else what the state dir runs, else single."""
    chosen = os.environ.get("TOPOLOGY") or recorded() or SINGLE
    if chosen not in TOPOLOGIES:
        raise StackError(f"TOPOLOGY={chosen!r}: choose one of {', '.join(TOPOLOGIES)}")
    return chosen


def record(topology: str) -> None:
    _record().parent.mkdir(parents=True, exist_ok=True)
    _record().write_text(topology + "\n")


def is_cluster() -> bool:
    return current() == CLUSTER


def cluster_servers(joiner: str) -> list[Service]:
    """Mosquitto, the three Kafka nodes, InfluxDB, and with the Spark joiner the Spark master and workers."""
    servers: list[Service] = [Mosquitto(), *(kafka_cluster.KafkaNode(n) for n in kafka_cluster.NODES), InfluxDB()]
    if joiner == "spark":
        servers += [spark_cluster.SparkMaster(), *(spark_cluster.SparkWorker(n) for n in spark_cluster.WORKERS)]
    return servers


def _stage_environment() -> dict[str, str]:
    """What every stage of the cluster is given: all three Kafka nodes to bootstrap from."""
    return {"KAFKA_BOOTSTRAP_SERVERS": kafka_cluster.bootstrap_servers()}


def stream_connector() -> Service:
    return PipelineProcess("stream-connector", "stream_connector", stop_grace_s=35.0, env=_stage_environment())


def db_connectors() -> list[Service]:
    """Two DB connectors in one consumer group, each with its own static membership."""
    return [PipelineProcess(f"db-connector-{n}", "db_connector", "--group-instance-id", f"db-connector-{n}",
                            env=_stage_environment()) for n in INSTANCES]


def lsb_joiners() -> list[Service]:
    """Two standalone joiners in one group: the instance id names each one's static membership and its
    transactional id (kafka-joiner.<instance id>), so each fences only its own predecessor."""
    return [PipelineProcess(f"lsb-joiner-{n}", "kafka_joiner", "--instance-id", f"lsb-joiner-{n}",
                            "--input-partitioned-by-thing", env=_stage_environment()) for n in INSTANCES]


def spark_joiner() -> Service:
    """The Spark joiner's driver, in client mode on this host (a standalone cluster runs no Python driver in
    cluster mode); supervisord restarts it and it resumes its checkpoint, which lies in the state dir: on
    several hosts, storage every host that may run the driver reaches (README, "Scaling")."""
    environment = {**_stage_environment(), "SPARK_CONF_DIR": str(spark_cluster.joiner_conf_dir()),
                   "SPARK_LOCAL_IP": spark_cluster.local_ip()}
    return _SparkDriver("spark-joiner", "spark_joiner", "--master", spark_cluster.master_url(),
                        "--checkpoint-dir", str(paths.STATE_DIR / "spark-joiner" / "checkpoint"),
                        start_deadline_s=300.0, startsecs=30.0, env=environment)


class _SparkDriver(PipelineProcess):
    def prepare(self) -> None:
        spark_cluster.render_joiner_conf()


def cluster_joiners() -> dict[str, list[Service]]:
    return {"lsb": lsb_joiners(), "spark": [spark_joiner()]}


def cluster_pipeline(joiner: str) -> list[Service]:
    return [stream_connector(), *cluster_joiners()[joiner], *db_connectors()]


def every_cluster_service() -> list[Service]:
    """Every program of the cluster, whichever joiner runs, in start order."""
    return [*cluster_servers("spark"), stream_connector(), *lsb_joiners(), spark_joiner(), *db_connectors()]


def status_lines(names: list[str]) -> list[str]:
    """`status` of the cluster beyond each process's own line: the Spark master's view of its workers and of
    the joiner's application, when the Spark master is among `names`."""
    return spark_cluster.application_lines() if spark_cluster.SparkMaster.name in names else []
