"""Kafka with SECURITY=on: a private broker of the native stack, formatted with the admin's SCRAM credential, the
stages' users and ACLs set as `make up` sets them (ops/stack/kafka_acls.py). Each principal is refused what it must
not do and can do its own job. Own ports, state folder and credentials file: the shared stack is never touched."""
from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import NewTopic, OffsetSpec

from pipeline_core import credentials
from pipeline_core.kafka_clients import (admin_client, consumer_config, kafka_ready, producer_config,
                                         retry_transient, transactional_producer_config)
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, MACHINE_OUT
from stack import certificates, manager, security
from stack.kafka_acls import (DB_CONNECTOR_GROUP, LSB_JOINER_NAME, SPARK_JOINER_NAME, acl_bindings,
                              existing_bindings, kafka_users)
from stack.services import Kafka
from support import free_ports

pytestmark = pytest.mark.integration

TIMEOUT_S = 15.0
STAGES = ("stream-connector", "lsb-joiner", "spark-joiner", "db-connector", "monitor")


@contextmanager
def secure_stack_kafka(state_dir: Path, tls: bool = False) -> Iterator[str]:
    """A Kafka started by the stack with SECURITY=on (STACK_TLS=on with `tls`), on free ports and a state folder
    of its own; the environment points at its credentials while it runs."""
    kafka_port, controller_port = free_ports(2)
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


def delivery_errors(bootstrap: str, principal: str, topic: str, **config: object) -> list[KafkaError | None]:
    producer = Producer(producer_config(bootstrap, **as_principal(principal), **config))
    errors: list[KafkaError | None] = []
    producer.produce(topic, b"{}", on_delivery=lambda error, _message: errors.append(error))
    assert producer.flush(TIMEOUT_S) == 0
    return errors


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
    assert delivery_errors(secure_kafka, "db-connector", MACHINE_DATA.name)[0].code() == \
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert delivery_errors(secure_kafka, "lsb-joiner", MACHINE_DATA.name)[0].code() == \
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert delivery_errors(secure_kafka, "stream-connector", MACHINE_DATA.name) == [None]
    assert delivery_errors(secure_kafka, "stream-connector", MACHINE_DLQ.name) == [None]
    assert delivery_errors(secure_kafka, "db-connector", MACHINE_DLQ.name) == [None]


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
    assert delivery_errors(secure_kafka, "monitor", MACHINE_DLQ.name, **{"enable.idempotence": False})[0].code() == \
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
    delivery_errors(secure_kafka, "stream-connector", MACHINE_DATA.name)  # something to read
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
        consumer.assign([TopicPartition(MACHINE_DATA.name, p, 0) for p in range(MACHINE_DATA.partitions)])
        message = first_record(consumer)
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
    delivery_errors(secure_kafka, "stream-connector", MACHINE_DATA.name)
    delivery_errors(secure_kafka, "admin", MACHINE_OUT.name)
    consumer = Consumer(consumer_config(secure_kafka, DB_CONNECTOR_GROUP, **as_principal("db-connector")))
    try:
        consumer.assign([TopicPartition(topic.name, partition, 0) for topic in (MACHINE_DATA, MACHINE_OUT)
                         for partition in range(topic.partitions)])
        last = {}
        while len(last) < 2:
            message = first_record(consumer)
            last[message.topic()] = message
        consumer.commit(offsets=[TopicPartition(m.topic(), m.partition(), m.offset() + 1) for m in last.values()],
                        asynchronous=False)
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


def test_with_tls_clients_trust_the_generated_ca_and_no_other(tmp_path: Path) -> None:
    with secure_stack_kafka(tmp_path / "state", tls=True) as bootstrap:
        admin = as_principal("admin")
        assert admin["security.protocol"] == "SASL_SSL"
        ca = Path(admin["ssl.ca.location"])
        assert ca.parent == tmp_path / "state" / "tls"
        assert all(path.stat().st_mode & 0o777 == 0o600 for path in ca.parent.glob("*key*.pem"))
        assert delivery_errors(bootstrap, "stream-connector", MACHINE_DATA.name) == [None]
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
