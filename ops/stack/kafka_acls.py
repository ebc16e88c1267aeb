"""Who may do what on Kafka: each stage's principal, its SCRAM user and its least-privilege ACLs, in one table.

The native stack (`python -m stack up` and `python -m stack topics`), the cluster topology and Compose's init job
all apply it with `ensure_kafka_principals`. Only `admin` (the brokers' super user) creates or deletes the
pipeline's topics and changes ACLs; the standalone joiner creates its own internal topics, under its prefix."""
from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                   ResourcePatternType, ResourceType, ScramCredentialInfo, ScramMechanism,
                                   UserScramCredentialUpsertion)

from pipeline_core import credentials
from pipeline_core.topics import stage_topics

log = logging.getLogger(__name__)

# SCRAM's iteration count: Kafka's minimum is 4096; higher slows every connection's handshake.
SCRAM_ITERATIONS = 8192
REQUEST_TIMEOUT_S = 30.0

# The group and prefix names the stages use by default (their settings; each stage's README). A stage run with
# other ones needs other grants; other topic names are granted (`kafka_grants`).
LSB_JOINER_NAME = "kafka-joiner"  # group, transactional-id prefix and internal-topic prefix (kafka_joiner.settings)
SPARK_JOINER_NAME = "spark-joiner"  # sink transactional ids and groups, Spark source groups (spark_joiner)
DB_CONNECTOR_GROUP = "db-connector"
STREAM_CONNECTOR_TAIL_GROUP = "stream-connector-tail"  # its start-up read of the topics' tails (no commits)
# Its instances' groups that keep the partition counts each placed records by (stream_connector.partition_switch):
# `<MQTT client id>.partitioning`, the client ids starting with this.
STREAM_CONNECTOR_PLACEMENT_PREFIX = "stream-connector"
# Its start-up fence, an aborted transaction (stream_connector.redelivery.FENCE_TRANSACTIONAL_ID_PREFIX).
STREAM_CONNECTOR_FENCE_PREFIX = "stream-connector-fence."

READ = AclOperation.READ
WRITE = AclOperation.WRITE
DESCRIBE = AclOperation.DESCRIBE
DESCRIBE_CONFIGS = AclOperation.DESCRIBE_CONFIGS
CREATE = AclOperation.CREATE
ALTER = AclOperation.ALTER
IDEMPOTENT_WRITE = AclOperation.IDEMPOTENT_WRITE
LITERAL = ResourcePatternType.LITERAL
PREFIXED = ResourcePatternType.PREFIXED
TOPIC = ResourceType.TOPIC
GROUP = ResourceType.GROUP
TRANSACTIONAL_ID = ResourceType.TRANSACTIONAL_ID
CLUSTER = ResourceType.BROKER  # confluent-kafka's name for Kafka's CLUSTER resource
CLUSTER_NAME = "kafka-cluster"
WILDCARD = "*"  # with LITERAL: every resource of the type


@dataclass(frozen=True)
class Grant:
    """Operations one principal may do on the resources `name` names (exactly, or as a prefix)."""

    resource: ResourceType
    name: str
    operations: tuple[AclOperation, ...]
    pattern: ResourcePatternType = LITERAL


def _topic(name: str, *operations: AclOperation, pattern: ResourcePatternType = LITERAL) -> Grant:
    return Grant(TOPIC, name, operations, pattern)


_IDEMPOTENT = Grant(CLUSTER, CLUSTER_NAME, (IDEMPOTENT_WRITE,))


def kafka_grants(environ: Mapping[str, str] | None = None) -> dict[str, tuple[Grant, ...]]:
    """Each principal's grants, on the topics its stage is set to use (`pipeline_core.topics.stage_topics`, from
    `environ`, default this process's: the pipeline's topics unless a stage's variables name others). The admin
    user is the brokers' super user (super.users) and needs no ACL. Writers of dead letters read the DLQ's
    max.message.bytes, to size their letters (topics.dead_letter_limit)."""
    connector, lsb, spark, db = (stage_topics(stage, environ) for stage in
                                 ("stream-connector", "lsb-joiner", "spark-joiner", "db-connector"))
    return {
        "stream-connector": (
            # Writes the records and their dead letters; reads both topics' tails at start to skip redeliveries.
            _topic(connector["data"], WRITE, READ, DESCRIBE),
            _topic(connector["dlq"], WRITE, READ, DESCRIBE, DESCRIBE_CONFIGS),
            Grant(GROUP, STREAM_CONNECTOR_TAIL_GROUP, (READ, DESCRIBE)),
            Grant(GROUP, STREAM_CONNECTOR_PLACEMENT_PREFIX, (READ, DESCRIBE), PREFIXED),
            # After machine.data grew: whether the joiners read what it placed by the old count (their positions).
            Grant(GROUP, LSB_JOINER_NAME, (DESCRIBE,), PREFIXED),
            Grant(GROUP, SPARK_JOINER_NAME, (DESCRIBE,), PREFIXED),
            Grant(TRANSACTIONAL_ID, STREAM_CONNECTOR_FENCE_PREFIX, (WRITE, DESCRIBE), PREFIXED),
            _IDEMPOTENT,
        ),
        "lsb-joiner": (
            _topic(lsb["data"], READ, DESCRIBE),
            _topic(lsb["out"], WRITE, DESCRIBE),
            _topic(lsb["dlq"], WRITE, DESCRIBE, DESCRIBE_CONFIGS),
            # Its internal topics (the input co-partitioned by thing, the state changelog, the handover topic): it
            # creates them at start, and adds partitions to them when its input grew.
            _topic(f"{LSB_JOINER_NAME}.", CREATE, ALTER, READ, WRITE, DESCRIBE, DESCRIBE_CONFIGS, pattern=PREFIXED),
            Grant(GROUP, LSB_JOINER_NAME, (READ, DESCRIBE), PREFIXED),  # its group and its changelog reader's
            Grant(TRANSACTIONAL_ID, f"{LSB_JOINER_NAME}.", (WRITE, DESCRIBE), PREFIXED),
            _IDEMPOTENT,
        ),
        "spark-joiner": (
            _topic(spark["data"], READ, DESCRIBE),
            _topic(spark["out"], WRITE, DESCRIBE),
            _topic(spark["dlq"], WRITE, DESCRIBE, DESCRIBE_CONFIGS),
            # The Kafka source's groups (groupIdPrefix) and the sink's group named like its transactional id.
            Grant(GROUP, SPARK_JOINER_NAME, (READ, DESCRIBE), PREFIXED),
            Grant(TRANSACTIONAL_ID, f"{SPARK_JOINER_NAME}.", (WRITE, DESCRIBE), PREFIXED),
            _IDEMPOTENT,
        ),
        "db-connector": (
            _topic(db["data"], READ, DESCRIBE),
            _topic(db["out"], READ, DESCRIBE),
            # It reads the dead letters too (to count and store them), and writes its own.
            _topic(db["dlq"], READ, WRITE, DESCRIBE, DESCRIBE_CONFIGS),
            Grant(GROUP, DB_CONNECTOR_GROUP, (READ, DESCRIBE)),
            _IDEMPOTENT,
        ),
        # `make status`: topics' offsets and groups' committed offsets (lag), nothing else.
        "monitor": (
            _topic(WILDCARD, DESCRIBE),
            Grant(GROUP, WILDCARD, (DESCRIBE,)),
        ),
    }


def kafka_users() -> list[str]:
    """Every Kafka user of the pipeline's principals, admin first."""
    users = {p.kafka_user for p in credentials.PRINCIPALS.values() if p.kafka_user}
    return sorted(users, key=lambda user: (user != "admin", user))


def acl_bindings(user: str, environ: Mapping[str, str] | None = None) -> list[AclBinding]:
    """The ALLOW bindings of `user`'s grants (`kafka_grants(environ)`), from any host."""
    return _bindings(user, kafka_grants(environ))


def _bindings(user: str, grants: Mapping[str, tuple[Grant, ...]]) -> list[AclBinding]:
    return [AclBinding(grant.resource, grant.name, grant.pattern, f"User:{user}", "*", operation,
                       AclPermissionType.ALLOW)
            for grant in grants.get(user, ()) for operation in grant.operations]


def ensure_kafka_principals(admin: AdminClient, values: Mapping[str, str]) -> None:
    """Set every pipeline user's SCRAM credential to its password in `values` (the credentials file), create the
    ACLs of `kafka_grants()` and remove ACLs of those users that the table no longer holds. Idempotent; `admin`
    must be a client of the admin user. A credential set again to the same password is a no-op for running
    clients."""
    users = kafka_users()
    upsertions = [UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS),
        values[credentials.kafka_password_key(user)].encode())
        for user in users if user != "admin"]  # admin's was set at storage format; rotation sets it on purpose
    for user, future in admin.alter_user_scram_credentials(upsertions, request_timeout=REQUEST_TIMEOUT_S).items():
        future.result()
    grants = kafka_grants()
    wanted = [binding for user in users for binding in _bindings(user, grants)]
    wanted_set = set(wanted)
    stale = [binding for binding in existing_bindings(admin, users) if binding not in wanted_set]
    if stale:
        for future in admin.delete_acls([_exact_filter(b) for b in stale],
                                        request_timeout=REQUEST_TIMEOUT_S).values():
            future.result()
    for future in admin.create_acls(wanted, request_timeout=REQUEST_TIMEOUT_S).values():
        future.result()
    log.info("Kafka: SCRAM users %s; %d ACLs", ", ".join(users), len(wanted))


def set_scram_password(admin: AdminClient, user: str, password: str) -> None:
    """Give `user` a new SCRAM-SHA-512 password (its running clients keep their sessions; new ones need it)."""
    upsertion = UserScramCredentialUpsertion(user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS),
                                             password.encode())
    for future in admin.alter_user_scram_credentials([upsertion], request_timeout=REQUEST_TIMEOUT_S).values():
        future.result()


def existing_bindings(admin: AdminClient, users: list[str]) -> list[AclBinding]:
    """The ACLs Kafka holds for `users`."""
    principals = {f"User:{user}" for user in users}
    every = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                             AclPermissionType.ANY)
    bindings = admin.describe_acls(every, request_timeout=REQUEST_TIMEOUT_S).result()
    return [binding for binding in bindings if binding.principal in principals]


def _exact_filter(binding: AclBinding) -> AclBindingFilter:
    return AclBindingFilter(binding.restype, binding.name, binding.resource_pattern_type, binding.principal,
                            binding.host, binding.operation, binding.permission_type)
