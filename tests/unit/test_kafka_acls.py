"""The Kafka ACL table (ops/stack/kafka_acls.py) and the security switch (ops/stack/security.py): least privilege, the
names the stages use by default are the names the table grants, and a secure node trusts only the admin."""
from __future__ import annotations

import dataclasses

import pytest
from confluent_kafka.admin import AclOperation, ResourcePatternType, ResourceType

from db_connector.settings import DbConnectorSettings
from kafka_joiner.settings import KafkaJoinerSettings
from pipeline_core import credentials
from pipeline_core.kafka_clients import java_security_options, security_config
from pipeline_core.settings import KafkaSettings
from pipeline_core.topics import (MACHINE_DATA, MACHINE_DLQ, MACHINE_OUT, ROLE_TOPICS, STAGE_TOPIC_VARIABLES,
                                  configured_topics, stage_topics)
from spark_joiner.job import SOURCE_GROUP_PREFIX
from spark_joiner.settings import SparkJoinerSettings
from stream_connector.redelivery import fence_transactional_id
from stream_connector.settings import ConnectorSettings
from stack import kafka_acls, security
from stack.kafka_acls import acl_bindings, kafka_grants, kafka_users
from stack.processes import StackError


def allowed(user: str, resource: ResourceType, name: str, operation: AclOperation) -> bool:
    """What Kafka's authorizer would answer for this table (ALLOW only, LITERAL, `*` and PREFIXED)."""
    for binding in acl_bindings(user):
        if binding.restype != resource or binding.operation not in (operation, AclOperation.ALL):
            continue
        if binding.resource_pattern_type == ResourcePatternType.PREFIXED and name.startswith(binding.name):
            return True
        if binding.resource_pattern_type == ResourcePatternType.LITERAL and binding.name in (name, "*"):
            return True
    return False


def test_every_kafka_principal_but_the_super_user_has_grants_and_nobody_else_does() -> None:
    assert kafka_users()[0] == "admin"
    assert set(kafka_grants()) == set(kafka_users()) - {"admin"}


def test_nobody_but_admin_deletes_alters_or_creates_the_pipelines_topics() -> None:
    forbidden = {AclOperation.ALL, AclOperation.DELETE, AclOperation.ALTER_CONFIGS, AclOperation.CLUSTER_ACTION}
    for user in kafka_grants():
        assert not {binding.operation for binding in acl_bindings(user)} & forbidden, user
        for topic in (MACHINE_DATA, MACHINE_OUT, MACHINE_DLQ):
            for operation in (AclOperation.CREATE, AclOperation.ALTER):
                assert not allowed(user, ResourceType.TOPIC, topic.name, operation), (user, topic.name, operation)
        assert not allowed(user, ResourceType.BROKER, "kafka-cluster", AclOperation.CREATE), user
    # The standalone joiner adds partitions to its own topics (changelog, handover) when its input grew, and only there.
    altering = {(user, binding.name) for user in kafka_grants() for binding in acl_bindings(user)
                if binding.operation == AclOperation.ALTER}
    assert altering == {("lsb-joiner", "kafka-joiner.")}


def test_each_stage_writes_only_its_own_topics() -> None:
    writers = {topic.name: {user for user in kafka_grants() if allowed(user, ResourceType.TOPIC, topic.name,
                                                                       AclOperation.WRITE)}
               for topic in (MACHINE_DATA, MACHINE_OUT, MACHINE_DLQ)}
    assert writers == {
        MACHINE_DATA.name: {"stream-connector"},
        MACHINE_OUT.name: {"lsb-joiner", "spark-joiner"},
        MACHINE_DLQ.name: {"stream-connector", "lsb-joiner", "spark-joiner", "db-connector"},
    }
    readers = {topic.name: {user for user in kafka_grants() if allowed(user, ResourceType.TOPIC, topic.name,
                                                                       AclOperation.READ)}
               for topic in (MACHINE_DATA, MACHINE_OUT)}
    assert readers == {MACHINE_DATA.name: {"stream-connector", "lsb-joiner", "spark-joiner", "db-connector"},
                       MACHINE_OUT.name: {"db-connector"}}


def test_the_monitor_only_describes() -> None:
    assert {binding.operation for binding in acl_bindings("monitor")} == {AclOperation.DESCRIBE}


def test_the_stages_default_names_are_the_granted_ones_and_nobody_shares_them() -> None:
    lsb = KafkaJoinerSettings(input_partitioned_by_thing=True)
    lsb_repartitioned = KafkaJoinerSettings()
    spark = SparkJoinerSettings()
    uses = {
        "lsb-joiner": [(ResourceType.GROUP, lsb.group_id), (ResourceType.GROUP, f"{lsb.group_id}.restore"),
                       (ResourceType.TRANSACTIONAL_ID, f"{lsb.transactional_id_prefix}.lsb-joiner"),
                       *((ResourceType.TOPIC, name) for name in (lsb.state_topic_name(),
                                                                 lsb_repartitioned.repartition_topic_name(),
                                                                 lsb_repartitioned.state_topic_name()))],
        "spark-joiner": [(ResourceType.GROUP, spark.sink_transactional_id()),
                         (ResourceType.GROUP, f"{SOURCE_GROUP_PREFIX}-0f8fad5b-d9cb-469f-a165-70867728950e"),
                         (ResourceType.TRANSACTIONAL_ID, spark.sink_transactional_id())],
        "db-connector": [(ResourceType.GROUP, DbConnectorSettings().group_id)],
        "stream-connector": [(ResourceType.GROUP, kafka_acls.STREAM_CONNECTOR_TAIL_GROUP),
                             (ResourceType.TRANSACTIONAL_ID, fence_transactional_id(ConnectorSettings().mqtt_client_id))],
    }
    for user, resources in uses.items():
        for resource, name in resources:
            operation = AclOperation.WRITE if resource == ResourceType.TRANSACTIONAL_ID else AclOperation.READ
            assert allowed(user, resource, name, operation), (user, name)
            others = [other for other in kafka_grants()
                      if other != user and allowed(other, resource, name, operation)]
            assert not others, (name, others)
    assert allowed("lsb-joiner", ResourceType.TOPIC, lsb.state_topic_name(), AclOperation.CREATE)


def test_a_clients_security_settings_follow_its_protocol() -> None:
    assert security_config(KafkaSettings()) == {}
    sasl = KafkaSettings(kafka_security_protocol="SASL_SSL", kafka_sasl_username="db-connector",
                         kafka_sasl_password="secret", kafka_ssl_ca_location="/ca.pem")
    assert security_config(sasl) == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                                     "sasl.username": "db-connector", "sasl.password": "secret",
                                     "ssl.ca.location": "/ca.pem"}
    java = java_security_options(sasl)
    assert java["kafka.sasl.jaas.config"].startswith("org.apache.kafka.common.security.scram.ScramLoginModule")
    assert java["kafka.ssl.truststore.location"] == "/ca.pem"
    assert "secret" not in repr(sasl)  # a logged settings object shows no password


def test_a_secure_nodes_properties_trust_only_the_admin() -> None:
    values = {credentials.kafka_password_key("admin"): "admin-secret", "KAFKA_CONTROLLER_PASSWORD": "controller"}
    lines = security.kafka_node_security_properties(values).splitlines()
    assert "super.users=User:admin" in lines
    assert "allow.everyone.if.no.acl.found=false" in lines
    assert "sasl.mechanism.controller.protocol=PLAIN" in lines
    assert "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512" in lines


def test_security_is_not_switched_on_over_a_kafka_formatted_without_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("pipeline_core.paths.STATE_DIR", tmp_path)
    monkeypatch.setenv(credentials.CREDENTIALS_FILE_ENV, str(tmp_path / "credentials.env"))
    monkeypatch.setenv(security.SECURITY_ENV, "on")
    (tmp_path / "kafka" / "data").mkdir(parents=True)
    (tmp_path / "kafka" / "data" / "meta.properties").write_text("node.id=1\n")
    with pytest.raises(StackError, match="make clean"):
        security.ensure_credentials()
    assert not credentials.is_secure()


def test_topic_names_given_to_the_stages_are_created_and_granted_to_them() -> None:
    """A stage's topic variables (its settings) drive the topics the stack creates and the grants of its user:
    a plant's own topics need no hand-made ACL, and no stage gains a topic it was not given."""
    environ = {"STREAM_CONNECTOR_DATA_TOPIC": "plant1.data", "KAFKA_JOINER_INPUT_TOPIC": "plant1.data",
               "KAFKA_JOINER_OUTPUT_TOPIC": "plant1.out", "DB_CONNECTOR_DATA_TOPIC": "plant1.data",
               "DB_CONNECTOR_OUT_TOPIC": "plant1.out", "DLQ_TOPIC": "plant1.dlq"}
    specs = {spec.name: spec for spec in configured_topics(environ)}
    assert set(specs) == {"plant1.data", "plant1.out", "plant1.dlq", MACHINE_DATA.name, MACHINE_OUT.name,
                          MACHINE_DLQ.name}  # the Spark joiner's and the other dead letters' are the defaults
    assert specs["plant1.data"].partitions == MACHINE_DATA.partitions
    assert specs["plant1.dlq"].config == MACHINE_DLQ.config

    def may(user: str, topic: str, operation: AclOperation) -> bool:
        return any(binding.name == topic and binding.operation == operation for binding in acl_bindings(user, environ))

    assert may("stream-connector", "plant1.data", AclOperation.WRITE)
    assert may("stream-connector", "plant1.dlq", AclOperation.WRITE)  # DLQ_TOPIC: its former variable
    assert not may("stream-connector", MACHINE_DATA.name, AclOperation.WRITE)
    assert may("lsb-joiner", "plant1.data", AclOperation.READ) and may("lsb-joiner", "plant1.out", AclOperation.WRITE)
    assert may("db-connector", "plant1.out", AclOperation.READ)
    assert not may("spark-joiner", "plant1.out", AclOperation.WRITE)
    assert may("spark-joiner", MACHINE_OUT.name, AclOperation.WRITE)


@pytest.mark.parametrize("stage, cls", [("stream-connector", ConnectorSettings), ("lsb-joiner", KafkaJoinerSettings),
                                        ("spark-joiner", SparkJoinerSettings), ("db-connector", DbConnectorSettings)])
def test_the_topic_variables_are_the_stages_own(stage: str, cls: type) -> None:
    """The stack reads each stage's topic names by the variables the stage's settings read, former names too."""
    for role, names in STAGE_TOPIC_VARIABLES[stage].items():
        field = next(field for field in dataclasses.fields(cls) if field.metadata["env"] == names[0])
        assert names[1:] == tuple(name for name in (field.metadata["formerly"] or (None, None))[1:] if name), role
        assert field.default == ROLE_TOPICS[role].name
        assert stage_topics(stage, {names[-1]: "elsewhere"})[role] == "elsewhere"
