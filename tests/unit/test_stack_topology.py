"""TOPOLOGY=cluster without processes: which stack runs, each Kafka node's configuration, the stages' instances
and what the topics are created with."""
from __future__ import annotations

import configparser
from pathlib import Path

import pytest

from pipeline_core.topics import BROKER_DEFAULT, replication
from stack import kafka_cluster, manager, supervision, topology
from stack.processes import StackError


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setattr("pipeline_core.paths.STATE_DIR", tmp_path)
    for name in ("TOPOLOGY", *topology.CLUSTER_PORTS, *[f"KAFKA_NODE{n}_HOST" for n in kafka_cluster.NODES]):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


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


def test_the_three_nodes_share_a_quorum_and_replicate_each_topic_three_times(state_dir, monkeypatch):
    monkeypatch.setenv("KAFKA_PORT", "30092")
    monkeypatch.setenv("KAFKA_NODE3_CONTROLLER_PORT", "30197")
    monkeypatch.setattr(kafka_cluster.KafkaNode, "security_properties", lambda node: f"# secured {node.node_id}")
    nodes = [kafka_cluster.KafkaNode(n) for n in kafka_cluster.NODES]
    configs = [properties(node.render_config()) for node in nodes]
    assert [c["node.id"] for c in configs] == ["1", "2", "3"]
    assert len({c["log.dirs"] for c in configs}) == 3
    assert len({c["listeners"] for c in configs}) == 3
    assert {c["controller.quorum.voters"] for c in configs} == {
        f"1@127.0.0.1:{nodes[0].ports()['controller']},2@127.0.0.1:9095,3@127.0.0.1:30197"}
    assert configs[0]["advertised.listeners"] == "PLAINTEXT://127.0.0.1:30092"
    for config in configs:
        assert config["default.replication.factor"] == config["offsets.topic.replication.factor"] == "3"
        assert config["transaction.state.log.replication.factor"] == "3"
        assert config["min.insync.replicas"] == config["transaction.state.log.min.isr"] == "2"
    assert nodes[1].config_file.read_text().endswith("# secured 2\n")  # the security hook follows the template
    assert kafka_cluster.bootstrap_servers() == "127.0.0.1:30092,127.0.0.1:9094,127.0.0.1:9096"


def test_the_nodes_start_together_and_every_other_service_alone(state_dir, monkeypatch):
    monkeypatch.setenv("TOPOLOGY", "cluster")
    groups = manager._start_groups(manager.all_services())
    assert [[s.name for s in group] for group in groups][:3] == [["mosquitto"], ["kafka-1", "kafka-2", "kafka-3"],
                                                                 ["influxdb"]]


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
