"""Which stack `python -m stack` runs: TOPOLOGY=single (the default: one Kafka broker, the joiner in one
process) or cluster (three Kafka nodes with replication factor 3, a Spark standalone master and two workers, and
every scaled stage as two instances), and the services of the cluster.

Which topology runs is `choice`'s (a module that imports nothing of the stack, so that the security settings
can ask it without an import circle)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pipeline_core import credentials
from . import join_specs, joiners, kafka_cluster, placement, spark_cluster
from .choice import current, is_cluster, is_hosts, record, recorded  # noqa: F401 (asked of the topology by its callers)
from .processes import StackError, free_loopback_ports, port_is_free
from .services import InfluxDB, Mosquitto, PipelineProcess, Service

# Instances of each scaled stage on the cluster: one group, distinct instance ids.
INSTANCES = (1, 2)
# Every port of the single stack, and every one the cluster adds (what a stack beside others must set).
SINGLE_PORTS = ("MQTT_PORT", "KAFKA_PORT", "KAFKA_CONTROLLER_PORT", "INFLUXDB_PORT", "INFLUXDB_RPC_PORT")
CLUSTER_PORTS = ("MQTT_TLS_PORT", "KAFKA_NODE2_PORT", "KAFKA_NODE2_CONTROLLER_PORT", "KAFKA_NODE3_PORT", "KAFKA_NODE3_CONTROLLER_PORT",
                 "SPARK_MASTER_PORT", "SPARK_MASTER_WEBUI_PORT", "SPARK_WORKER1_PORT", "SPARK_WORKER1_WEBUI_PORT",
                 "SPARK_WORKER2_PORT", "SPARK_WORKER2_WEBUI_PORT", "SPARK_DRIVER_PORT", "SPARK_BLOCKMANAGER_PORT")


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
    # On hosts it reaches Mosquitto across the network: its TLS listener.
    mqtt = placement.mqtt_client_environment() if is_hosts() else {}
    return PipelineProcess("stream-connector", "stream_connector", stop_grace_s=35.0,
                           env={**_stage_environment(), **mqtt, **joiners.connector_environment(cluster=True)})


def db_connectors() -> list[Service]:
    """Two DB connectors in one consumer group, each with its own static membership."""
    return [PipelineProcess(f"db-connector-{n}", "db_connector", "--group-instance-id", f"db-connector-{n}",
                            env=_stage_environment()) for n in INSTANCES]


def lsb_joiners() -> list[Service]:
    """Two standalone joiners in one group: the instance id names each one's static membership and its
    transactional id (kafka-joiner.<instance id>), so each fences only its own predecessor."""
    return [PipelineProcess(f"lsb-joiner-{n}", "kafka_joiner", "--instance-id", f"lsb-joiner-{n}",
                            "--input-partitioned-by-thing", env={**_stage_environment(), **join_specs.environment()})
            for n in INSTANCES]


def spark_joiner() -> Service:
    """The Spark joiner, submitted with spark-submit to the standalone master in client deploy mode (a standalone
    cluster runs no Python driver in cluster mode), so its driver runs here under supervisord, which restarts it;
    it resumes its checkpoint, which lies in the state dir: on several hosts, storage every host that may run the
    driver, and every executor, reaches (docs/scaling.md)."""
    return SparkSubmittedJoiner()


class SparkSubmittedJoiner(PipelineProcess):
    """`spark-submit` of the package `make spark-package` builds (rebuilt into the state dir at each `up`, so the
    driver and executors run the checkout's code); spark-defaults.conf in its SPARK_CONF_DIR holds the cluster's
    ports and executor sizes."""

    # Its READY line and its heartbeat are the Python driver's, which the spark-submit JVM runs.
    heartbeat_of_child = True

    def __init__(self) -> None:
        super().__init__("spark-joiner", "spark_joiner", start_deadline_s=300.0, startsecs=30.0,
                         env={**_stage_environment(), **join_specs.environment(),
                              "SPARK_CONF_DIR": str(spark_cluster.joiner_conf_dir()),
                              # Its driver runs from the package, away from the checkout: where its identity is.
                              credentials.CREDENTIALS_FILE_ENV: str(credentials.credentials_file())})

    def environment(self) -> dict[str, str]:
        # Spark's, read when its program is rendered: on the hosts, the address of the driver's host.
        return {**super().environment(), **spark_cluster.spark_environment()}

    @property
    def package_dir(self) -> Path:
        return self.state_dir / "package"

    def prepare(self) -> None:
        spark_cluster.render_joiner_conf()
        built = subprocess.run([sys.executable, "-m", "spark_joiner.package", str(self.package_dir)],
                               capture_output=True, text=True, timeout=300)
        if built.returncode != 0:
            raise StackError(f"building the Spark joiner's package failed:\n{built.stdout}{built.stderr}")

    def command(self) -> list[str]:
        return [spark_cluster.spark_submit(), "--master", spark_cluster.master_url(), "--deploy-mode", "client",
                "--name", "spark-joiner", "--jars", str(self.package_dir / "jars" / "*.jar"),
                "--py-files", str(self.package_dir / "spark-joiner.zip"),
                "--conf", f"spark.pyspark.python={sys.executable}",
                # The driver JVM's temporary files in the state dir, as every program's (Service.temp_dir).
                "--driver-java-options", f"-Djava.io.tmpdir={self.temp_dir}",
                str(self.package_dir / "spark_joiner_job.py"),
                "--progress-file", str(self.progress_file), "--checkpoint-dir", str(self.state_dir / "checkpoint")]



def cluster_joiners() -> dict[str, list[Service]]:
    return {"lsb": lsb_joiners(), "spark": [spark_joiner()]}


def cluster_pipeline(joiner: str) -> list[Service]:
    return [stream_connector(), *cluster_joiners()[joiner], *db_connectors()]


def every_cluster_service() -> list[Service]:
    """Every program of the cluster, whichever joiner runs, in start order."""
    return [*cluster_servers("spark"), stream_connector(), *lsb_joiners(), spark_joiner(), *db_connectors()]


def status_lines(names: list[str]) -> list[str]:
    """`status` of the cluster beyond each process's own line: the Spark master's view of its workers and of
    the joiner's application, when the Spark master is among `names`; on the hosts, what each host reaches."""
    lines = spark_cluster.application_lines() if spark_cluster.SparkMaster.name in names else []
    return lines + (placement.host_lines(names) if is_hosts() else [])


def private_ports(names: tuple[str, ...], port_range: str | None = None) -> dict[str, int]:
    """A port nothing listens on now for each of `names`, for a stack of its own beside others (tests,
    benchmarks): from `port_range` ("first-last") when given, else any the system offers."""
    if not port_range:
        return dict(zip(names, free_loopback_ports(len(names))))
    first, last = (int(part) for part in port_range.split("-"))
    free = [port for port in range(first, last + 1) if port_is_free(port)]
    if len(free) < len(names):
        raise StackError(f"ports {port_range}: {len(free)} free, {len(names)} needed")
    return dict(zip(names, free))
