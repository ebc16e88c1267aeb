"""TOPOLOGY=cluster without processes: which stack runs, each Kafka node's configuration and security, the stages'
instances and what the topics are created with."""
from __future__ import annotations

import configparser
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from pipeline_core import credentials
from pipeline_core.topics import BROKER_DEFAULT, replication
from stack import kafka_cluster, manager, security, services, spark_cluster, supervision, topology
from stack.processes import StackError


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setattr("pipeline_core.paths.STATE_DIR", tmp_path)
    for name in ("TOPOLOGY", "SECURITY", "STACK_TLS", "STACK_TLS_CERT_FILE", credentials.CREDENTIALS_FILE_ENV,
                 *topology.CLUSTER_PORTS, *[f"KAFKA_NODE{n}_HOST" for n in kafka_cluster.NODES]):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


@pytest.fixture
def secure_cluster(state_dir, monkeypatch) -> dict[str, str]:
    """TOPOLOGY=cluster with the credentials (and CA) `up` makes before any server starts."""
    monkeypatch.setenv("TOPOLOGY", "cluster")
    return security.ensure_credentials()


def properties(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))


def test_the_environment_chooses_the_topology_else_what_the_state_dir_ran_else_single(state_dir, monkeypatch):
    assert topology.current() == "single"
    topology.record("cluster")
    assert topology.current() == "cluster"
    monkeypatch.setenv("TOPOLOGY", "single")
    assert topology.current() == "single"
    monkeypatch.setenv("TOPOLOGY", "three")
    with pytest.raises(StackError, match="TOPOLOGY='three'"):
        topology.current()


def test_the_three_nodes_share_a_quorum_and_replicate_each_topic_three_times(secure_cluster, monkeypatch):
    monkeypatch.setenv("KAFKA_PORT", "30092")
    monkeypatch.setenv("KAFKA_NODE3_CONTROLLER_PORT", "30197")
    monkeypatch.setattr(kafka_cluster.KafkaNode, "security_properties",
                        lambda node, values: f"# secured {node.node_id}")
    nodes = [kafka_cluster.KafkaNode(n) for n in kafka_cluster.NODES]
    configs = [properties(node.render_config()) for node in nodes]
    assert [c["node.id"] for c in configs] == ["1", "2", "3"]
    assert len({c["log.dirs"] for c in configs}) == 3
    assert len({c["listeners"] for c in configs}) == 3
    assert {c["controller.quorum.voters"] for c in configs} == {
        f"1@127.0.0.1:{nodes[0].ports()['controller']},2@127.0.0.1:9095,3@127.0.0.1:30197"}
    assert configs[0]["advertised.listeners"] == "CLIENT://127.0.0.1:30092"
    for config in configs:
        assert config["default.replication.factor"] == config["offsets.topic.replication.factor"] == "3"
        assert config["transaction.state.log.replication.factor"] == "3"
        assert config["min.insync.replicas"] == config["transaction.state.log.min.isr"] == "2"
    assert nodes[1].config_file.read_text().endswith("# secured 2\n")  # the security hook follows the template
    assert kafka_cluster.bootstrap_servers() == "127.0.0.1:30092,127.0.0.1:9094,127.0.0.1:9096"


@pytest.mark.parametrize("joiner", ["lsb", "spark"])
def test_the_servers_start_together_then_the_workers_then_the_pipeline(state_dir, monkeypatch, joiner):
    monkeypatch.setenv("TOPOLOGY", "cluster")
    monkeypatch.setenv("JOINER", joiner)
    groups = [[s.name for s in group] for group in manager._start_groups(manager.all_services())]
    servers = ["mosquitto", "kafka-1", "kafka-2", "kafka-3", "influxdb"]
    pipeline = ["stream-connector", *(["lsb-joiner-1", "lsb-joiner-2"] if joiner == "lsb" else ["spark-joiner"]),
                "db-connector-1", "db-connector-2"]
    spark = [servers + ["spark-master"], ["spark-worker-1", "spark-worker-2"]] if joiner == "spark" else [servers]
    assert groups == [*spark, pipeline]


def test_the_single_stack_starts_its_servers_together_then_its_stages(state_dir, monkeypatch):
    monkeypatch.setenv("TOPOLOGY", "single")
    monkeypatch.setenv("JOINER", "spark")
    groups = [[s.name for s in group] for group in manager._start_groups(manager.all_services())]
    assert groups == [["mosquitto", "kafka", "influxdb"], ["stream-connector", "spark-joiner", "db-connector"]]


@pytest.mark.parametrize("joiner, scaled", [("lsb", ["lsb-joiner", "db-connector"]), ("spark", ["db-connector"])])
def test_each_scaled_stage_runs_twice_in_one_group_with_its_own_instance_id(state_dir, monkeypatch, joiner, scaled):
    monkeypatch.setenv("TOPOLOGY", "cluster")
    monkeypatch.setenv("JOINER", joiner)
    config = configparser.ConfigParser()
    config.read(supervision.render_config(manager.all_services()))
    for stage in scaled:
        commands = [config[f"program:{stage}-{n}"]["command"] for n in topology.INSTANCES]
        assert len(set(commands)) == 2 and all(f"{stage}-{n}" in commands[n - 1] for n in topology.INSTANCES)
    for name in [s.name for s in manager.pipeline()]:
        assert f'KAFKA_BOOTSTRAP_SERVERS="{kafka_cluster.bootstrap_servers()}"' in config[f"program:{name}"]["environment"]


def test_topics_take_the_brokers_replication_unless_told():  # 1 on the single broker, 3 on the cluster
    assert replication({}) == (BROKER_DEFAULT, {})
    assert replication({"KAFKA_REPLICATION_FACTOR": "3", "KAFKA_MIN_INSYNC_REPLICAS": "2"}) == (
        3, {"min.insync.replicas": "2"})


def test_the_cluster_is_secure_with_tls_without_being_asked(state_dir, monkeypatch):
    assert not security.requested() and not services.tls_enabled()
    # Credentials a single stack made with SECURITY=on, without TLS: the cluster moves every client to TLS.
    credentials.ensure_credentials(extra={"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"})
    monkeypatch.setenv("TOPOLOGY", "cluster")
    assert security.requested() and services.tls_enabled()
    values = security.ensure_credentials()
    assert values == credentials.read_credentials()
    assert values["KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert Path(values["KAFKA_SSL_CA_LOCATION"]).is_file()
    assert values[security.SPARK_SECRET_KEY]
    client = credentials.environment("db-connector", values)
    assert client["KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL" and client["KAFKA_SSL_CA_LOCATION"] == values[
        "KAFKA_SSL_CA_LOCATION"]
    assert "mqtt-tls" in services.Mosquitto().ports()
    with pytest.raises(StackError, match="always secure"):
        credentials.credentials_file().unlink()
        kafka_cluster.KafkaNode(1).render_config()


def test_each_node_takes_sasl_ssl_on_both_listeners_with_its_own_certificate_and_acls(secure_cluster):
    nodes = [kafka_cluster.KafkaNode(n) for n in kafka_cluster.NODES]
    configs = [properties(node.render_config()) for node in nodes]
    for node, config in zip(nodes, configs):
        assert stat.S_IMODE(node.config_file.stat().st_mode) == 0o600  # it holds the admin's passwords
        assert config["listener.security.protocol.map"] == "CLIENT:SASL_SSL,CONTROLLER:SASL_SSL"
        assert "PLAINTEXT" not in config["listeners"] + config["advertised.listeners"]
        assert config["inter.broker.listener.name"] == "CLIENT"
        assert config["listener.name.client.sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
        assert config["sasl.mechanism.inter.broker.protocol"] == "SCRAM-SHA-512"
        assert f'password="{secure_cluster["KAFKA_ADMIN_PASSWORD"]}"' in config[
            "listener.name.client.scram-sha-512.sasl.jaas.config"]
        assert config["authorizer.class.name"] == security.STANDARD_AUTHORIZER
        assert config["super.users"] == "User:admin" and config["allow.everyone.if.no.acl.found"] == "false"
        assert config["ssl.truststore.location"] == secure_cluster["KAFKA_SSL_CA_LOCATION"]
        assert config["listener.name.client.ssl.keystore.location"] == config[
            "listener.name.controller.ssl.keystore.location"]
    keystores = {config["listener.name.client.ssl.keystore.location"] for config in configs}
    assert len(keystores) == 3
    names = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName",
                            "-in", keystores.pop()], capture_output=True, text=True, check=True).stdout
    assert "IP Address:127.0.0.1" in names and "DNS:localhost" in names and f"DNS:{socket.gethostname()}" in names


def test_each_node_is_formatted_with_the_one_cluster_id_and_the_admins_scram_credential(secure_cluster, monkeypatch):
    """The arguments of kafka-storage format, read from the argument file the java launcher gets, which stays until
    the format is done."""
    formats: list[tuple[list[str], str]] = []

    class Format:
        returncode = 0

        def __init__(self, command, **_kwargs):
            self.argument_file = Path(command[-1].removeprefix("@"))
            formats.append((command, self.argument_file.read_text()))

        def communicate(self, timeout=None):
            assert self.argument_file.exists()
            return "", None

    nodes = [kafka_cluster.KafkaNode(n) for n in kafka_cluster.NODES]
    for node in nodes:
        node.render_config()  # its certificate, made by openssl before subprocess.Popen is replaced
    monkeypatch.setattr(services.Kafka, "_java", lambda node: ["java"])
    monkeypatch.setattr(services.subprocess, "Popen", Format)
    for node in nodes:
        node.prepare()
    for node in nodes:
        node.await_prepared()
    password = secure_cluster["KAFKA_ADMIN_PASSWORD"]
    assert len(formats) == 3
    for command, arguments in formats:
        assert password not in " ".join(command)  # off the command line
        assert f"--cluster-id={kafka_cluster.cluster_id()}" in arguments.splitlines()
        assert f"SCRAM-SHA-512=[name=admin,password={password}]" in arguments.splitlines()
    assert not list(Path(credentials.credentials_file()).parent.glob("kafka-*/format.args"))


def test_spark_authenticates_its_master_workers_and_driver_with_one_secret_kept_from_command_lines(secure_cluster):
    daemons = [spark_cluster.SparkMaster(), *(spark_cluster.SparkWorker(n) for n in spark_cluster.WORKERS)]
    conf_files = []
    for daemon in daemons:
        daemon.prepare()
        conf_files.append(Path(daemon.environment()["SPARK_CONF_DIR"]) / "spark-defaults.conf")
    conf_files.append(spark_cluster.render_joiner_conf() / "spark-defaults.conf")
    secret = secure_cluster[security.SPARK_SECRET_KEY]
    for conf in conf_files:
        assert stat.S_IMODE(conf.stat().st_mode) == 0o600
        assert "spark.authenticate true" in conf.read_text().splitlines()
        assert f"spark.authenticate.secret {secret}" in conf.read_text().splitlines()
    # The master's REST submission server authenticates nobody: off (the joiner is submitted over the RPC).
    assert "spark.master.rest.enabled false" in conf_files[0].read_text().splitlines()
    for service in [*daemons, topology.spark_joiner()]:
        assert secret not in " ".join(service.command())
    joiner = topology.spark_joiner().environment()
    assert joiner[credentials.CREDENTIALS_FILE_ENV] == str(credentials.credentials_file())
