"""Kafka with SECURITY=on: a private broker of the native stack, formatted with the admin's SCRAM credential, the
stages' users and ACLs set as `make up` sets them (ops/stack/kafka_acls.py). Each principal is refused what it must
not do and can do its own job. Own ports, state folder and credentials file: the shared stack is never touched."""
from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import (Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, Producer,
                             TopicCollection, TopicPartition)
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AlterConfigOpType,
                                   ConfigEntry, ConfigResource, NewPartitions, NewTopic, OffsetSpec,
                                   ResourcePatternType, ResourceType)

from pipeline_core import credentials
from pipeline_core.kafka_clients import (admin_client, consumer_config, kafka_ready, producer_config,
                                         retry_transient, transactional_producer_config)
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, MACHINE_OUT
from stack import certificates, manager, security
from stack.kafka_acls import (DB_CONNECTOR_GROUP, LSB_JOINER_NAME, SPARK_JOINER_NAME, STREAM_CONNECTOR_FENCE_PREFIX,
                              STREAM_CONNECTOR_TAIL_GROUP, Grant, acl_bindings, existing_bindings, kafka_grants,
                              kafka_users)
from stack.services import Kafka
from stack.processes import free_loopback_ports

pytestmark = pytest.mark.integration

TIMEOUT_S = 15.0
STAGES = ("stream-connector", "lsb-joiner", "spark-joiner", "db-connector", "monitor")


@contextmanager
def secure_stack_kafka(state_dir: Path, tls: bool = False) -> Iterator[str]:
    """A Kafka started by the stack with SECURITY=on (STACK_TLS=on with `tls`), on free ports and a state folder
    of its own; the environment points at its credentials while it runs."""
    kafka_port, controller_port = free_loopback_ports(2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("pipeline_core.paths.STATE_DIR", state_dir)
        patch.setenv("STACK_STATE_DIR", str(state_dir))
        patch.setenv(credentials.CREDENTIALS_FILE_ENV, str(state_dir / "credentials.env"))
        patch.setenv("SECURITY", "on")
        patch.setenv("STACK_TLS", "on" if tls else "off")
        patch.setenv("KAFKA_PORT", str(kafka_port))
        patch.setenv("KAFKA_CONTROLLER_PORT", str(controller_port))
        for name in ("KAFKA_SECURITY_PROTOCOL", "KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD", "KAFKA_SSL_CA_LOCATION",
                     "KAFKA_BOOTSTRAP_SERVERS"):
            patch.delenv(name, raising=False)
        security.ensure_credentials()
        kafka = Kafka()
        manager.up([kafka])
        try:
            yield kafka.bootstrap_servers
        finally:
            manager.down([kafka])


@pytest.fixture(scope="module")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with secure_stack_kafka(tmp_path_factory.mktemp("secure") / "state") as bootstrap:
        yield bootstrap


def as_principal(principal: str) -> dict[str, str]:
    return security.client_security(principal)


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class Delivery:
    """What the broker answered to one record of the test's own: its payload, which no other test writes."""

    error: KafkaError | None
    payload: bytes
    partition: int
    offset: int


def deliver(bootstrap: str, principal: str, topic: str, **config: object) -> Delivery:
    """One record produced as `principal`, a payload of its own, and its delivery report: there must be one."""
    producer = Producer(producer_config(bootstrap, **as_principal(principal), **config))
    payload = json.dumps({"probe": unique("delivery-")}).encode()
    reports: list[Delivery] = []
    producer.produce(topic, payload, on_delivery=lambda error, message: reports.append(
        Delivery(error, payload, message.partition(), message.offset())))
    assert producer.flush(TIMEOUT_S) == 0, f"{principal}'s record to {topic} neither delivered nor refused"
    assert len(reports) == 1, reports
    return reports[0]


def delivered(bootstrap: str, principal: str, topic: str) -> Delivery:
    """`deliver`, which the broker must have taken."""
    report = deliver(bootstrap, principal, topic)
    assert report.error is None and report.offset >= 0, f"{principal} could not write {topic}: {report.error}"
    return report


def refused(bootstrap: str, principal: str, topic: str, **config: object) -> int:
    """`deliver`, which the broker must have refused; the error's code."""
    report = deliver(bootstrap, principal, topic, **config)
    assert report.error is not None, f"{principal} wrote {topic} (offset {report.offset})"
    return report.error.code()


def own_record(consumer: Consumer, delivery: Delivery, topic: str):
    """The record `delivery` wrote, read where it lies (assigned at its offset): nothing another test wrote."""
    consumer.assign([TopicPartition(topic, delivery.partition, delivery.offset)])
    message = first_record(consumer)
    assert (message.partition(), message.offset(), message.value()) == \
        (delivery.partition, delivery.offset, delivery.payload), "not the test's own record"
    return message


def error_code(call) -> int:
    with pytest.raises(KafkaException) as raised:
        call()
    return raised.value.args[0].code()


def test_the_file_is_the_owners_and_the_broker_refuses_whoever_does_not_authenticate(secure_kafka: str) -> None:
    assert credentials.credentials_file().stat().st_mode & 0o777 == 0o600
    assert (Path(credentials.credentials_file()).parent / "kafka" / "server.properties").stat().st_mode & 0o777 == 0o600
    assert kafka_ready(secure_kafka, security=as_principal("admin"))
    assert not kafka_ready(secure_kafka)  # anonymous, PLAINTEXT

    seen: list[KafkaError] = []
    wrong = {**as_principal("db-connector"), "sasl.password": "not-its-password", "error_cb": seen.append}
    admin = admin_client(secure_kafka, **wrong)
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    for _ in range(50):  # the error callback runs in poll
        if seen:
            break
        admin.poll(0.1)
    assert KafkaError._AUTHENTICATION in {error.code() for error in seen}


def test_each_stage_writes_only_where_it_must(secure_kafka: str) -> None:
    assert refused(secure_kafka, "db-connector", MACHINE_DATA.name) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert refused(secure_kafka, "lsb-joiner", MACHINE_DATA.name) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    delivered(secure_kafka, "stream-connector", MACHINE_DATA.name)
    delivered(secure_kafka, "stream-connector", MACHINE_DLQ.name)
    delivered(secure_kafka, "db-connector", MACHINE_DLQ.name)


@pytest.mark.parametrize("principal", STAGES)
def test_only_admin_creates_or_deletes_the_pipelines_topics(secure_kafka: str, principal: str) -> None:
    admin = admin_client(secure_kafka, **as_principal(principal))
    deleted = admin.delete_topics([MACHINE_DATA.name], operation_timeout=TIMEOUT_S)[MACHINE_DATA.name]
    assert error_code(lambda: deleted.result(TIMEOUT_S)) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    name = unique("machine.extra.")
    created = admin.create_topics([NewTopic(name, 1, 1)], operation_timeout=TIMEOUT_S)[name]
    assert error_code(lambda: created.result(TIMEOUT_S)) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert MACHINE_DATA.name in admin_client(secure_kafka, **as_principal("admin")).list_topics(timeout=5).topics


def test_a_joiner_cannot_take_another_principals_group_or_transactional_id(secure_kafka: str) -> None:
    producer = Producer(transactional_producer_config(secure_kafka, unique(f"{SPARK_JOINER_NAME}."),
                                                      **as_principal("lsb-joiner")))
    assert error_code(lambda: producer.init_transactions(TIMEOUT_S)) == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED

    consumer = Consumer(consumer_config(secure_kafka, DB_CONNECTOR_GROUP, **as_principal("spark-joiner")))
    try:
        consumer.subscribe([MACHINE_DATA.name])
        assert first_error(consumer) == KafkaError.GROUP_AUTHORIZATION_FAILED
    finally:
        consumer.close()


def test_the_monitor_reads_lag_but_no_record(secure_kafka: str) -> None:
    monitor = admin_client(secure_kafka, **as_principal("monitor"))
    end = TopicPartition(MACHINE_DATA.name, 0)
    assert monitor.list_offsets({end: OffsetSpec.latest()}, request_timeout=TIMEOUT_S)[end].result().offset >= 0
    group = retry_transient(  # a fresh broker answers NOT_COORDINATOR while it creates __consumer_offsets
        lambda: monitor.describe_consumer_groups([DB_CONNECTOR_GROUP], request_timeout=TIMEOUT_S)[DB_CONNECTOR_GROUP]
        .result(), what="describing a group", deadline_s=60)
    assert group.group_id == DB_CONNECTOR_GROUP
    # Not idempotent: an idempotent producer is refused sooner, for the cluster, as it has no topic to write.
    assert refused(secure_kafka, "monitor", MACHINE_DLQ.name, **{"enable.idempotence": False}) == \
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    consumer = Consumer(consumer_config(secure_kafka, unique("monitor-"), **as_principal("monitor")))
    try:
        consumer.assign([TopicPartition(MACHINE_DATA.name, 0, 0)])
        assert first_error(consumer) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        consumer.close()


@pytest.mark.parametrize(("principal", "group", "transactional_id", "internal_topic"), [
    ("lsb-joiner", LSB_JOINER_NAME, f"{LSB_JOINER_NAME}.lsb-joiner", f"{LSB_JOINER_NAME}.{MACHINE_DATA.name}.state"),
    ("spark-joiner", f"{SPARK_JOINER_NAME}.0123456789ab", f"{SPARK_JOINER_NAME}.0123456789ab", None),
])
def test_a_joiner_reads_and_commits_its_output_and_offsets_in_one_transaction(
        secure_kafka: str, principal: str, group: str, transactional_id: str, internal_topic: str | None) -> None:
    mine = delivered(secure_kafka, "stream-connector", MACHINE_DATA.name)  # the record it reads
    identity = as_principal(principal)
    if internal_topic:  # the standalone joiner creates its own internal topics
        admin = admin_client(secure_kafka, **identity)
        created = admin.create_topics([NewTopic(internal_topic, 1, 1)], operation_timeout=TIMEOUT_S)[internal_topic]
        try:
            created.result(TIMEOUT_S)
        except KafkaException as error:
            assert error.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
    consumer = Consumer(consumer_config(secure_kafka, group, **identity))
    producer = Producer(transactional_producer_config(secure_kafka, transactional_id, **identity))
    try:
        message = own_record(consumer, mine, MACHINE_DATA.name)
        producer.init_transactions(TIMEOUT_S)
        producer.begin_transaction()
        producer.produce(MACHINE_OUT.name, message.value())
        producer.produce(MACHINE_DLQ.name, b"{}")
        producer.send_offsets_to_transaction(
            [TopicPartition(message.topic(), message.partition(), message.offset() + 1)],
            consumer.consumer_group_metadata(), TIMEOUT_S)
        producer.commit_transaction(TIMEOUT_S)
    finally:
        consumer.close()


def test_the_db_connector_reads_both_topics_and_commits_in_its_group(secure_kafka: str) -> None:
    mine = {MACHINE_DATA.name: delivered(secure_kafka, "stream-connector", MACHINE_DATA.name),
            MACHINE_OUT.name: delivered(secure_kafka, "admin", MACHINE_OUT.name)}
    consumer = Consumer(consumer_config(secure_kafka, DB_CONNECTOR_GROUP, **as_principal("db-connector")))
    try:
        read = [own_record(consumer, delivery, topic) for topic, delivery in mine.items()]
        committed = consumer.commit(offsets=[TopicPartition(m.topic(), m.partition(), m.offset() + 1) for m in read],
                                    asynchronous=False)
        assert all(partition.error is None for partition in committed), committed
    finally:
        consumer.close()


def test_stack_topics_sets_the_users_and_acls_again_idempotently(secure_kafka: str) -> None:
    """What Compose's init job runs; `make up` ran it once already."""
    done = subprocess.run([sys.executable, "-m", "stack", "topics"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Kafka users and ACLs: admin, " in done.stdout
    admin = admin_client(secure_kafka, **as_principal("admin"))
    held = existing_bindings(admin, kafka_users())
    assert sorted(map(str, held)) == sorted(str(b) for user in kafka_users() for b in acl_bindings(user))


def test_with_tls_clients_trust_the_generated_ca_and_no_other(state_dir: Path, tmp_path: Path) -> None:
    with secure_stack_kafka(state_dir, tls=True) as bootstrap:
        admin = as_principal("admin")
        assert admin["security.protocol"] == "SASL_SSL"
        ca = Path(admin["ssl.ca.location"])
        assert ca.parent == state_dir / "tls"
        assert all(path.stat().st_mode & 0o777 == 0o600 for path in ca.parent.glob("*key*.pem"))
        delivered(bootstrap, "stream-connector", MACHINE_DATA.name)
        other_ca = certificates.ensure_ca(tmp_path / "other-ca")
        assert not kafka_ready(bootstrap, security={**admin, "ssl.ca.location": str(other_ca)})
        assert not kafka_ready(bootstrap, security={**admin, "security.protocol": "SASL_PLAINTEXT"})


def first_record(consumer: Consumer, polls: int = 100):
    for _ in range(polls):
        message = consumer.poll(0.2)
        if message is None:
            continue
        assert message.error() is None, message.error()
        return message
    raise AssertionError("no record")


def first_error(consumer: Consumer, polls: int = 100) -> int:
    for _ in range(polls):
        message = consumer.poll(0.2)
        if message is not None and message.error() is not None:
            return message.error().code()
    raise AssertionError("no error")


# The ACL table (stack/kafka_acls.py) row by row on the broker: for every principal, each operation on each resource
# below is tried for real and must be allowed exactly when the table grants it (admin, the super user: always).
# Kafka's own implications count: READ, WRITE, DELETE and ALTER give DESCRIBE, ALTER_CONFIGS gives DESCRIBE_CONFIGS.
PROBE_TOPIC = f"{LSB_JOINER_NAME}.acl-probe"  # under the standalone joiner's prefix
OTHER_TOPIC = "acl-probe.other"  # nobody's but admin's (and the monitor's DESCRIBE of every topic)
ACL_TOPICS = (MACHINE_DATA.name, MACHINE_OUT.name, MACHINE_DLQ.name, PROBE_TOPIC, OTHER_TOPIC)
ACL_GROUPS = (DB_CONNECTOR_GROUP, STREAM_CONNECTOR_TAIL_GROUP, LSB_JOINER_NAME, f"{SPARK_JOINER_NAME}.acl-probe",
              "acl-probe-group")
ACL_TRANSACTIONAL_IDS = (f"{LSB_JOINER_NAME}.acl-probe", f"{SPARK_JOINER_NAME}.acl-probe",
                         f"{STREAM_CONNECTOR_FENCE_PREFIX}acl-probe", "acl-probe-transaction")
TOPIC_OPERATIONS = (AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS,
                    AclOperation.CREATE, AclOperation.DELETE, AclOperation.ALTER, AclOperation.ALTER_CONFIGS)
GROUP_OPERATIONS = (AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE)
# A transactional id's DESCRIBE is tried with its WRITE: init_transactions finds the id's coordinator first.
TRANSACTIONAL_OPERATIONS = (AclOperation.WRITE,)
CLUSTER_OPERATIONS = (AclOperation.IDEMPOTENT_WRITE, AclOperation.DESCRIBE, AclOperation.ALTER)
IMPLIED_BY = {AclOperation.DESCRIBE: {AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE, AclOperation.ALTER},
              AclOperation.DESCRIBE_CONFIGS: {AclOperation.ALTER_CONFIGS}}


def rows_granting(principal: str, resource: ResourceType, name: str, operation: AclOperation) -> list[Grant]:
    """The rows of the table that let `principal` do `operation` on `name`."""
    wanted = {operation, AclOperation.ALL, *IMPLIED_BY.get(operation, ())}
    return [grant for grant in kafka_grants().get(principal, ())
            if grant.resource == resource and set(grant.operations) & wanted
            and (name.startswith(grant.name) if grant.pattern == ResourcePatternType.PREFIXED
                 else grant.name in (name, "*"))]


def outcome(call, denied: int, *allowed_errors: int) -> bool:
    """True if `call` went through (or failed with one of `allowed_errors`, which only come after the authoriser
    let it pass), False if it was refused with `denied`; any other error fails the test."""
    try:
        call()
    except KafkaException as error:
        code = error.args[0].code()
        if code == denied:
            return False
        assert code in allowed_errors, f"{error}: neither done nor refused with {KafkaError(denied).name()}"
    return True


class Prober:
    """Tries one operation of one principal on one resource on the real broker; says whether it was allowed."""

    def __init__(self, bootstrap: str, principal: str) -> None:
        self.bootstrap, self.principal = bootstrap, principal
        self.identity = as_principal(principal)
        self.admin = admin_client(bootstrap, **self.identity)
        self.producer = Producer(producer_config(bootstrap, **self.identity, **{"enable.idempotence": False,
                                                                                 "message.timeout.ms": 10_000}))

    def topic(self, name: str, operation: AclOperation) -> bool:
        denied, admin = KafkaError.TOPIC_AUTHORIZATION_FAILED, self.admin
        if operation == AclOperation.WRITE:
            errors: list[KafkaError | None] = []
            try:
                self.producer.produce(name, b"{}", on_delivery=lambda error, _message: errors.append(error))
            except KafkaException as error:
                # Refused at once when the client's metadata already says the topic is not this principal's
                # (an earlier probe of it), else in the delivery report.
                if error.args[0].code() == denied:
                    return False
                raise
            assert self.producer.flush(TIMEOUT_S) == 0 and len(errors) == 1, errors
            return outcome(lambda: _raise(errors[0]), denied)
        if operation == AclOperation.READ:
            return self._read(name)
        if operation == AclOperation.DESCRIBE:
            return outcome(lambda: admin.describe_topics(TopicCollection([name]), request_timeout=TIMEOUT_S)[name]
                           .result(), denied)
        if operation == AclOperation.DESCRIBE_CONFIGS:
            resource = ConfigResource(ResourceType.TOPIC, name)
            return outcome(lambda: admin.describe_configs([resource], request_timeout=TIMEOUT_S)[resource].result(),
                           denied)
        if operation == AclOperation.CREATE:
            # The topic exists: allowed, the broker answers TOPIC_ALREADY_EXISTS. Validation only, in any case.
            return outcome(lambda: admin.create_topics([NewTopic(name, 1, 1)], validate_only=True,
                                                       operation_timeout=TIMEOUT_S)[name].result(TIMEOUT_S), denied,
                           KafkaError.TOPIC_ALREADY_EXISTS)
        if operation == AclOperation.ALTER:
            more = len(admin_client(self.bootstrap, **as_principal("admin")).list_topics(name, timeout=5)
                       .topics[name].partitions) + 1
            return outcome(lambda: admin.create_partitions([NewPartitions(name, more)], validate_only=True,
                                                           operation_timeout=TIMEOUT_S)[name].result(TIMEOUT_S),
                           denied)
        if operation == AclOperation.ALTER_CONFIGS:
            resource = ConfigResource(ResourceType.TOPIC, name, incremental_configs=[
                ConfigEntry("retention.ms", str(2 * 24 * 3600 * 1000),
                            incremental_operation=AlterConfigOpType.SET)])
            return outcome(lambda: admin.incremental_alter_configs([resource], validate_only=True,
                                                                   request_timeout=TIMEOUT_S)[resource].result(),
                           denied)
        if operation == AclOperation.DELETE:
            # Deleting is real: on a copy of the topic's name made for it when the principal may delete (admin).
            target = name if self.principal != "admin" else _scratch_topic(self.bootstrap)
            return outcome(lambda: admin.delete_topics([target], operation_timeout=TIMEOUT_S)[target]
                           .result(TIMEOUT_S), denied)
        raise AssertionError(f"no probe for {operation} on a topic")

    def _read(self, name: str) -> bool:
        if not self.topic(name, AclOperation.DESCRIBE):
            return False  # READ gives DESCRIBE: without DESCRIBE, no READ (and a fetch would wait, not be refused)
        consumer = Consumer(consumer_config(self.bootstrap, unique("acl-probe-reader-"), **self.identity,
                                            **{"enable.partition.eof": True}))
        try:
            consumer.assign([TopicPartition(name, 0, 0)])
            for _ in range(100):
                message = consumer.poll(0.2)
                if message is None:
                    continue
                if message.error() is None or message.error().code() == KafkaError._PARTITION_EOF:
                    return True
                if message.error().code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    return False
                if message.error().code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                    continue  # the reader's own group (it commits nothing): a fetch needs none
                raise AssertionError(f"{self.principal} reading {name}: {message.error()}")
            raise AssertionError(f"{self.principal} reading {name}: neither a record nor a refusal")
        finally:
            consumer.close()

    def group(self, name: str, operation: AclOperation) -> bool:
        denied, admin = KafkaError.GROUP_AUTHORIZATION_FAILED, self.admin
        if operation == AclOperation.READ:
            # Committing an offset: the group's READ is checked before the topic's (then TOPIC_AUTHORIZATION_FAILED).
            offsets = ConsumerGroupTopicPartitions(name, [TopicPartition(MACHINE_DATA.name, 0, 0)])
            return outcome(lambda: _raise_partition_errors(admin.alter_consumer_group_offsets(
                [offsets], request_timeout=TIMEOUT_S)[name].result()), denied)
        if operation == AclOperation.DESCRIBE:
            return outcome(lambda: admin.describe_consumer_groups([name], request_timeout=TIMEOUT_S)[name].result(),
                           denied)
        if operation == AclOperation.DELETE:
            return outcome(lambda: admin.delete_consumer_groups([name], request_timeout=TIMEOUT_S)[name].result(),
                           denied, KafkaError.GROUP_ID_NOT_FOUND, KafkaError.NON_EMPTY_GROUP)
        raise AssertionError(f"no probe for {operation} on a group")

    def transactional_id(self, name: str, operation: AclOperation) -> bool:
        assert operation == AclOperation.WRITE
        producer = Producer(transactional_producer_config(self.bootstrap, name, **self.identity))
        return outcome(lambda: producer.init_transactions(TIMEOUT_S), KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)

    def cluster(self, operation: AclOperation) -> bool:
        denied = KafkaError.CLUSTER_AUTHORIZATION_FAILED
        if operation == AclOperation.IDEMPOTENT_WRITE:
            # Kafka also lets a principal that may write any topic produce idempotently (KIP-679): every principal
            # with this row may; the one without (the monitor) is refused for the cluster before any topic.
            producer = Producer(producer_config(self.bootstrap, **self.identity, **{"message.timeout.ms": 10_000}))

            def produce() -> None:
                # A refused producer id is a fatal error, which flush raises. Whatever became of the record after
                # the producer id was granted says nothing of this permission, so no delivery report is asked for
                # (one is handed over as the fatal error is raised, which the client cannot do).
                producer.produce(MACHINE_DLQ.name, b"{}")
                assert producer.flush(TIMEOUT_S) == 0, "the record was neither delivered nor refused"

            return outcome(produce, denied)
        if operation == AclOperation.DESCRIBE:
            every = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                                     AclPermissionType.ANY)
            # The broker answers a principal without the cluster's DESCRIBE with no ACLs rather than an error; the
            # table's ACLs are there to see.
            seen = self.admin.describe_acls(every, request_timeout=TIMEOUT_S).result()
            return len(seen) >= len(acl_bindings("stream-connector"))
        if operation == AclOperation.ALTER:
            binding = AclBinding(ResourceType.TOPIC, OTHER_TOPIC, ResourcePatternType.LITERAL, "User:acl-probe", "*",
                                 AclOperation.READ, AclPermissionType.ALLOW)
            created = outcome(lambda: self.admin.create_acls([binding], request_timeout=TIMEOUT_S)[binding].result(),
                              denied)
            if created:
                exact = AclBindingFilter(ResourceType.TOPIC, OTHER_TOPIC, ResourcePatternType.LITERAL, "User:acl-probe",
                                         "*", AclOperation.READ, AclPermissionType.ALLOW)
                for future in self.admin.delete_acls([exact], request_timeout=TIMEOUT_S).values():
                    future.result()
            return created
        raise AssertionError(f"no probe for {operation} on the cluster")


def _raise(error: KafkaError | None) -> None:
    if error is not None:
        raise KafkaException(error)


def _raise_partition_errors(result: ConsumerGroupTopicPartitions) -> None:
    """A partition's error but the topic's refusal: the group's READ, checked first, was granted then."""
    for partition in result.topic_partitions:
        if partition.error is not None and partition.error.code() != KafkaError.TOPIC_AUTHORIZATION_FAILED:
            _raise(partition.error)


def _scratch_topic(bootstrap: str) -> str:
    name = unique("acl-probe.scratch-")
    admin = admin_client(bootstrap, **as_principal("admin"))
    admin.create_topics([NewTopic(name, 1, 1)], operation_timeout=TIMEOUT_S)[name].result(TIMEOUT_S)
    return name


def test_every_row_of_the_acl_table_holds_on_the_broker_grants_and_denials_for_every_principal(
        secure_kafka: str) -> None:
    admin = admin_client(secure_kafka, **as_principal("admin"))
    for name in (PROBE_TOPIC, OTHER_TOPIC):
        try:
            admin.create_topics([NewTopic(name, 1, 1)], operation_timeout=TIMEOUT_S)[name].result(TIMEOUT_S)
        except KafkaException as error:
            assert error.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
    delivered(secure_kafka, "admin", MACHINE_DATA.name)  # a record for the readers
    probes = [(ResourceType.TOPIC, name, operation) for name in ACL_TOPICS for operation in TOPIC_OPERATIONS]
    probes += [(ResourceType.GROUP, name, operation) for name in ACL_GROUPS for operation in GROUP_OPERATIONS]
    probes += [(ResourceType.TRANSACTIONAL_ID, name, operation)
               for name in ACL_TRANSACTIONAL_IDS for operation in TRANSACTIONAL_OPERATIONS]
    probes += [(ResourceType.BROKER, "kafka-cluster", operation) for operation in CLUSTER_OPERATIONS]
    wrong, allowed_rows = [], set()
    for principal in kafka_users():
        prober = Prober(secure_kafka, principal)
        for resource, name, operation in probes:
            granted = rows_granting(principal, resource, name, operation)
            expected = principal == "admin" or bool(granted)
            if resource == ResourceType.TOPIC:
                allowed = prober.topic(name, operation)
            elif resource == ResourceType.GROUP:
                allowed = prober.group(name, operation)
            elif resource == ResourceType.TRANSACTIONAL_ID:
                allowed = prober.transactional_id(name, operation)
            else:
                allowed = prober.cluster(operation)
            if allowed != expected:
                wrong.append(f"{principal} {operation.name} {resource.name} {name}: "
                             f"{'allowed' if allowed else 'refused'}, the table says {'yes' if expected else 'no'}")
            if allowed:
                implied = {operation, *({AclOperation.DESCRIBE} if resource == ResourceType.TRANSACTIONAL_ID else ())}
                allowed_rows.update((principal, grant, op) for grant in granted for op in grant.operations
                                    if op in implied)
    assert not wrong, "\n".join(wrong)
    # Every row and operation of the table was seen allowed on a resource it names: the probes cover the table.
    rows = {(principal, grant, operation) for principal, grants in kafka_grants().items() for grant in grants
            for operation in grant.operations}
    assert rows - allowed_rows == set(), f"rows no probe exercised: {sorted(map(str, rows - allowed_rows))}"
