"""The native stack's security switch, and what the servers need of it.

`make up SECURITY=on` (env SECURITY for `python -m stack up`) makes the credentials file before any server
starts; from then on the stack is secure for as long as the file exists (`credentials.is_secure()`), until
`make clean` deletes it with the rest of the state. STACK_TLS=on adds TLS to Kafka's client listener with a
generated CA (`certificates`). Without either, the stack is as before: loopback, no authentication.
TOPOLOGY=cluster is always secure, with TLS: its listeners are meant to cross hosts."""
from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline_core import credentials, paths
from pipeline_core.settings import KafkaSettings, load_settings
from . import certificates
from .choice import KAFKA_NODES, is_cluster, is_hosts
from .processes import StackError

SECURITY_ENV = "SECURITY"
TLS_ENV = "STACK_TLS"
ON = ("1", "on", "true", "yes")

SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
ADMIN = "admin"
# The shared secret of Spark's RPC authentication (spark.authenticate) on the cluster.
SPARK_SECRET_KEY = "SPARK_AUTHENTICATE_SECRET"


def requested() -> bool:
    """Security is wanted: SECURITY=on, the cluster topology, or this stack has its credentials already."""
    return os.environ.get(SECURITY_ENV, "").strip().lower() in ON or credentials.is_secure() or is_cluster()


def tls_requested() -> bool:
    """TLS on the listeners for other hosts: STACK_TLS=on, or the cluster topology (always)."""
    return os.environ.get(TLS_ENV, "").strip().lower() in ON or is_cluster()


def ensure_credentials() -> dict[str, str] | None:
    """Before any server starts: the credentials (made on first use), with the CA when TLS is on; None when
    the stack runs without security."""
    if not requested():
        return None
    if not credentials.is_secure() and (paths.STATE_DIR / "kafka" / "data" / "meta.properties").exists():
        raise StackError("SECURITY=on starts a stack from nothing: this one's Kafka was formatted without "
                         "authentication (it has no admin user). `make clean` (deletes all of its data), then "
                         "`make up SECURITY=on`")
    if tls_requested():
        tls = {"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SSL_CA_LOCATION": str(certificates.ensure_ca())}
        if listener_protocol(credentials.read_credentials()) != "SASL_SSL":
            # Credentials made without TLS (say, by the single stack's SECURITY=on): every client switches to it.
            credentials.write_credentials({**credentials.read_credentials(), **tls})
        if is_cluster():  # the Spark master, workers, executors and driver authenticate each other with it
            tls[SPARK_SECRET_KEY] = secrets.token_urlsafe(credentials.PASSWORD_BYTES)
        if is_hosts():  # InfluxDB is reached across hosts: over HTTPS, verified with the stack's CA
            tls[credentials.INFLUXDB_TLS_CA_KEY] = str(certificates.ensure_ca())
        return credentials.ensure_credentials(extra=tls)
    return credentials.ensure_credentials(extra={"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"})


def client_security(principal: str = ADMIN) -> dict[str, str]:
    """librdkafka settings of `principal` from the credentials file; empty when the stack is not secure."""
    from pipeline_core.kafka_clients import security_config  # confluent-kafka only where a client is made
    settings = load_settings(KafkaSettings, [], environ=credentials.environ_for(principal))
    return security_config(settings)


def listener_protocol(values: Mapping[str, str]) -> str:
    """The client listener's protocol for these credentials: SASL_SSL when they name a CA."""
    return values.get("KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")


@dataclass(frozen=True)
class NodeTls:
    """A node's TLS files: its PEM key store (key + certificate) and the CA it trusts."""

    keystore: Path
    ca: Path


def node_tls(values: Mapping[str, str], name: str, hosts: list[str]) -> NodeTls | None:
    """The node's certificate (made on first use) when the credentials say SASL_SSL, else None."""
    if listener_protocol(values) != "SASL_SSL":
        return None
    ca = Path(values.get("KAFKA_SSL_CA_LOCATION") or certificates.ensure_ca())
    return NodeTls(certificates.ensure_server_certificate(name, hosts, ca.parent).keystore, ca)


def kafka_node_security_properties(values: Mapping[str, str], tls: NodeTls | None = None, *,
                                   client_listener: str = "CLIENT", controller_listener: str = "CONTROLLER",
                                   controller_tls: bool = False) -> str:
    """The server.properties lines of a secure Kafka node (broker, controller or both), for the native stack's
    single node and each node of a cluster alike:
    - the client listener (also the inter-broker one) takes SASL/SCRAM-SHA-512; brokers talk to each other as
      `admin`, whose SCRAM credential `kafka_storage_scram_arguments` puts in the storage at format;
    - the controller listener takes SASL/PLAIN as `admin` with KAFKA_CONTROLLER_PASSWORD (KRaft keeps SCRAM
      credentials in the metadata the controllers serve, so they cannot use SCRAM themselves); with
      `controller_tls` (a cluster, whose controllers talk across hosts) over TLS with the node's certificate;
    - StandardAuthorizer, only `admin` a super user, nothing allowed without an ACL (kafka_acls).
    The listener names and `listener.security.protocol.map` are the caller's (protocol: `listener_protocol`).
    The lines hold passwords: write them to a file readable by its owner only."""
    admin_password = values[credentials.kafka_password_key(ADMIN)]
    controller_password = values["KAFKA_CONTROLLER_PASSWORD"]
    client, controller = client_listener.lower(), controller_listener.lower()
    lines = [
        f"listener.name.{client}.sasl.enabled.mechanisms={credentials.KAFKA_SASL_MECHANISM}",
        f"listener.name.{client}.{credentials.KAFKA_SASL_MECHANISM.lower()}.sasl.jaas.config={SCRAM_MODULE} "
        f'required username="{ADMIN}" password="{admin_password}";',
        f"sasl.mechanism.inter.broker.protocol={credentials.KAFKA_SASL_MECHANISM}",
        f"listener.name.{controller}.sasl.enabled.mechanisms=PLAIN",
        f"listener.name.{controller}.plain.sasl.jaas.config={PLAIN_MODULE} required "
        f'username="{ADMIN}" password="{controller_password}" user_{ADMIN}="{controller_password}";',
        "sasl.mechanism.controller.protocol=PLAIN",
        f"authorizer.class.name={STANDARD_AUTHORIZER}",
        f"super.users=User:{ADMIN}",
        "allow.everyone.if.no.acl.found=false",
    ]
    if tls:
        lines += [
            f"listener.name.{client}.ssl.keystore.type=PEM",
            f"listener.name.{client}.ssl.keystore.location={tls.keystore}",
            # The brokers' own connections (inter-broker) trust the same CA as every client.
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={tls.ca}",
        ]
        if controller_tls:
            lines += [f"listener.name.{controller}.ssl.keystore.type=PEM",
                      f"listener.name.{controller}.ssl.keystore.location={tls.keystore}"]
    return "\n".join(lines) + "\n"


def kafka_storage_scram_arguments(values: Mapping[str, str]) -> list[str]:
    """`kafka-storage format` arguments that bootstrap the admin user's SCRAM credential into the metadata (the
    only way to have a first SCRAM user in KRaft). They hold its password: pass them in a Java argument file
    readable by the owner only, never on a command line."""
    password = values[credentials.kafka_password_key(ADMIN)]
    return ["--add-scram", f"{credentials.KAFKA_SASL_MECHANISM}=[name={ADMIN},password={password}]"]


def controller_protocol(values: Mapping[str, str], tls: bool = False) -> str:
    """The controller listener's protocol: SASL (PLAIN) when secure, over TLS with `tls`."""
    if not values:
        return "PLAINTEXT"
    return "SASL_SSL" if tls else "SASL_PLAINTEXT"


def write_private(path: Path, text: str) -> Path:
    """Write `text` to `path`, readable and writable by its owner only from its first byte."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.chmod(path, 0o600)  # an existing file keeps its mode through os.open
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
    return path


def rotate_kafka_credential(principal: str, bootstrap_servers: str) -> list[str]:
    """Give `principal`'s Kafka user a new random password: on Kafka first (as admin), then in the credentials
    file. Returns the services to restart so they use it: the stage that runs as the principal, or Kafka itself
    for `admin` (its brokers log in to each other as admin; `up` writes the new password into its config)."""
    from pipeline_core.kafka_clients import admin_client  # confluent-kafka only where a client is made
    from .kafka_acls import set_scram_password
    user = credentials.PRINCIPALS[principal].kafka_user if principal in credentials.PRINCIPALS else None
    if not user:
        raise StackError(f"{principal!r} is no Kafka principal: choose one of "
                         + ", ".join(name for name, who in credentials.PRINCIPALS.items() if who.kafka_user))
    values = credentials.read_credentials()
    if not values:
        raise StackError("the stack is not secure: there are no credentials to rotate (`make up SECURITY=on`)")
    password = secrets.token_urlsafe(credentials.PASSWORD_BYTES)
    admin = admin_client(bootstrap_servers, **client_security(ADMIN))
    set_scram_password(admin, user, password)
    credentials.write_credentials({**values, credentials.kafka_password_key(user): password})
    if user != ADMIN:
        return [principal]
    # Each node of the cluster, one at a time: the others keep the quorum.
    return [f"kafka-{node}" for node in KAFKA_NODES] if is_cluster() else ["kafka"]
