"""The three-node Kafka cluster of TOPOLOGY=cluster: each node a combined KRaft broker + controller with its
own ports and data dir, all formatted with one cluster id, started together (a node waits for a quorum of
controllers before it serves).

The cluster is always secure: its listeners are meant for other hosts. Clients and the brokers among themselves
use SASL/SCRAM-SHA-512 over TLS, the controllers SASL/PLAIN over TLS, each node with its own certificate from
the stack's CA; StandardAuthorizer with an ACL per stage principal (kafka_acls)."""
from __future__ import annotations

import base64
import os
import socket
import uuid
from pathlib import Path
from string import Template

from pipeline_core import credentials, paths
from . import security
from .choice import KAFKA_NODES as NODES
from .processes import StackError
from .services import Kafka, ensure_topics_and_principals, env_port

REPLICATION_FACTOR = 3
MIN_INSYNC_REPLICAS = 2
# Ports of node 1 are the single broker's (KAFKA_PORT, KAFKA_CONTROLLER_PORT); the others have their own.
DEFAULT_PORTS = {2: (9094, 9095), 3: (9096, 9097)}


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

    # The JVM start of three nodes at once on two cores, then a leader election.
    start_deadline_s = 180.0
    # Three JVMs on one small host: a smaller heap each than the single broker's.
    default_heap = "-Xms128m -Xmx512m"

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.name = f"kafka-{node_id}"

    def ports(self) -> dict[str, int]:
        return node_ports(self.node_id)

    def bind_host(self, role: str) -> str:
        return node_host(self.node_id)  # both listeners (cluster-node.properties)

    @property
    def bootstrap_servers(self) -> str:
        return f"{node_host(self.node_id)}:{self.ports()['kafka']}"

    def certificate_hosts(self) -> list[str]:
        """The names the node's certificate is valid for: this host's loopback and name, and the node's host."""
        return list(dict.fromkeys(["127.0.0.1", "localhost", socket.gethostname(), node_host(self.node_id)]))

    def security_properties(self, values: dict[str, str]) -> str:
        """Properties appended to the node's rendered template: its SASL_SSL listeners, their JAAS settings and
        the ACL authorizer (`security.kafka_node_security_properties`, as the single node's)."""
        tls = security.node_tls(values, self.name, self.certificate_hosts())
        if tls is None:
            raise StackError("the cluster's Kafka nodes take TLS: the credentials file must say "
                             f"KAFKA_SECURITY_PROTOCOL=SASL_SSL ({credentials.credentials_file()})")
        return security.kafka_node_security_properties(values, tls, controller_tls=True)

    def server_properties(self, values: dict[str, str]) -> str:
        """The cluster template filled in, the node's security properties after it (later keys win)."""
        if not values:
            raise StackError("the cluster is always secure: `python -m stack up` makes its credentials before any "
                             "server starts")
        ports = self.ports()
        template = Template((paths.KAFKA_DIR / "cluster-node.properties").read_text()).substitute(
            node_id=self.node_id, quorum_voters=quorum_voters(), bind_host=node_host(self.node_id),
            advertised_host=node_host(self.node_id), port=ports["kafka"], controller_port=ports["controller"],
            data_dir=self.state_dir / "data", replication_factor=REPLICATION_FACTOR,
            min_insync_replicas=MIN_INSYNC_REPLICAS, client_protocol=security.listener_protocol(values),
            controller_protocol=security.controller_protocol(values, tls=True))
        return template.rstrip("\n") + "\n\n" + self.security_properties(values).rstrip("\n") + "\n"

    def storage_cluster_id(self) -> str:
        return cluster_id()

    def render_config(self) -> Path:
        """The node's server.properties (owner-only: it holds the admin's passwords)."""
        return security.write_private(self.config_file, self.server_properties(credentials.read_credentials()))

    def is_ready(self, pid: int | None = None) -> bool:
        """The node answers (as admin, over SASL_SSL), and the cluster's metadata it serves lists it as a broker
        (so it has joined)."""
        from confluent_kafka import KafkaException

        from pipeline_core.kafka_clients import admin_client
        try:
            metadata = admin_client(self.bootstrap_servers, log_level=0,
                                    **security.client_security()).list_topics(timeout=3.0)
        except KafkaException:
            return False
        return self.node_id in metadata.brokers

    @property
    def setup_id(self) -> str:
        return "kafka-cluster"  # every node's set-up is the cluster's topics and principals

    def after_ready(self) -> None:
        ensure_topics_and_principals(bootstrap_servers())
