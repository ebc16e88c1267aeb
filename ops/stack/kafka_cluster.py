"""The three-node Kafka cluster of TOPOLOGY=cluster: each node a combined KRaft broker + controller with its
own ports and data dir, all formatted with one cluster id, started together (a node waits for a quorum of
controllers before it serves)."""
from __future__ import annotations

import base64
import os
import subprocess
import uuid
from pathlib import Path

from pipeline_core import credentials, paths
from .processes import StackError
from .services import Kafka, env_port, render

NODES = (1, 2, 3)
REPLICATION_FACTOR = 3
MIN_INSYNC_REPLICAS = 2
# Ports of node 1 are the single broker's (KAFKA_PORT, KAFKA_CONTROLLER_PORT); the others have their own.
DEFAULT_PORTS = {2: (9094, 9095), 3: (9096, 9097)}
# The nodes are started together and each waits for a quorum of the others: the slowest JVM start sets the pace.
START_GROUP = "kafka-cluster"


def node_ports(node_id: int) -> dict[str, int]:
    """The node's client (broker) and controller ports: KAFKA_PORT/KAFKA_CONTROLLER_PORT for node 1,
    KAFKA_NODE<n>_PORT/KAFKA_NODE<n>_CONTROLLER_PORT for the others."""
    if node_id == 1:
        return {"kafka": env_port("KAFKA_PORT", 9092), "controller": env_port("KAFKA_CONTROLLER_PORT", 9093)}
    port, controller = DEFAULT_PORTS[node_id]
    return {"kafka": env_port(f"KAFKA_NODE{node_id}_PORT", port),
            "controller": env_port(f"KAFKA_NODE{node_id}_CONTROLLER_PORT", controller)}


def node_host(node_id: int) -> str:
    """The host name clients and the other nodes reach node `node_id` by (KAFKA_NODE<n>_HOST; this host's
    loopback by default). On several hosts, each node's own name: it is advertised to clients."""
    return os.environ.get(f"KAFKA_NODE{node_id}_HOST", "127.0.0.1")


def bootstrap_servers() -> str:
    """Every node's client address: what each stage and tool of the cluster is given."""
    return ",".join(f"{node_host(n)}:{node_ports(n)['kafka']}" for n in NODES)


def quorum_voters() -> str:
    return ",".join(f"{n}@{node_host(n)}:{node_ports(n)['controller']}" for n in NODES)


def cluster_id_file() -> Path:
    return paths.STATE_DIR / "kafka-cluster-id"


def cluster_id() -> str:
    """The one id every node is formatted with; made on the cluster's first start and kept in the state dir."""
    path = cluster_id_file()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=") + "\n")
    return path.read_text().strip()


class KafkaNode(Kafka):
    """Node `node_id` of the cluster: broker and controller in one JVM."""

    start_group = START_GROUP
    # The JVM start of three nodes at once on two cores, then a leader election.
    start_deadline_s = 180.0
    # Three JVMs on one small host: a smaller heap each than the single broker's.
    default_heap = "-Xms128m -Xmx512m"

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.name = f"kafka-{node_id}"

    def ports(self) -> dict[str, int]:
        return node_ports(self.node_id)

    @property
    def bootstrap_servers(self) -> str:
        return f"{node_host(self.node_id)}:{self.ports()['kafka']}"

    def security_properties(self) -> str:
        """Properties appended to the node's rendered server.properties: the place for its SASL/TLS listeners,
        their JAAS settings and the ACL authorizer when the stack is secure. Nothing yet: PLAINTEXT."""
        return ""

    def render_config(self) -> Path:
        """The node's server.properties: the cluster template filled in, its security properties after it."""
        ports = self.ports()
        render(paths.KAFKA_DIR / "cluster-node.properties", self.config_file,
               node_id=self.node_id, quorum_voters=quorum_voters(), bind_host=node_host(self.node_id),
               advertised_host=node_host(self.node_id), port=ports["kafka"], controller_port=ports["controller"],
               data_dir=self.state_dir / "data", replication_factor=REPLICATION_FACTOR,
               min_insync_replicas=MIN_INSYNC_REPLICAS)
        security = self.security_properties()
        if security:
            with open(self.config_file, "a") as config:
                config.write("\n" + security.rstrip("\n") + "\n")
        return self.config_file

    def prepare(self) -> None:
        if credentials.is_secure():
            raise StackError("the cluster's Kafka nodes do not take the stack's credentials yet "
                             "(KafkaNode.security_properties): `make clean`, then `make up TOPOLOGY=cluster` "
                             "without SECURITY=on")
        self.render_config()
        if (self.state_dir / "data" / "meta.properties").exists():
            return
        formatted = subprocess.run(
            [*self._java(), *self._jvm_flags(), "kafka.tools.StorageTool", "format",
             f"--cluster-id={cluster_id()}", "--config", str(self.config_file)],
            capture_output=True, text=True, timeout=120)
        if formatted.returncode != 0:
            raise StackError(f"formatting the KRaft storage of {self.name} failed:\n"
                             f"{formatted.stdout}{formatted.stderr}")

    def is_ready(self, pid: int | None = None) -> bool:
        """The node answers, and the cluster's metadata it serves lists it as a broker (so it has joined)."""
        from confluent_kafka import KafkaException

        from pipeline_core.kafka_clients import admin_client
        try:
            metadata = admin_client(self.bootstrap_servers, log_level=0).list_topics(timeout=1.0)
        except KafkaException:
            return False
        return self.node_id in metadata.brokers

    def after_ready(self) -> None:
        from pipeline_core.kafka_clients import admin_client
        from pipeline_core.topics import ensure_topics
        ensure_topics(admin_client(bootstrap_servers()))
