"""What `status` probes on a cluster run from a shell without the stack's host settings: the nodes, the Spark master
and Mosquitto's certificate names follow the settings the running stack was started with (configuration.take_noted
puts them in the environment), not 127.0.0.1 nor the shell's."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline_core import paths
from stack import configuration, kafka_cluster, services, spark_cluster

RUNNING = {"KAFKA_NODE1_HOST": "198.18.0.11", "KAFKA_NODE2_HOST": "kafka-2.plant.example",
           "KAFKA_NODE3_HOST": "kafka-3.plant.example", "KAFKA_NODE2_PORT": "21094",
           "SPARK_MASTER_HOST": "spark.plant.example", "SPARK_MASTER_WEBUI_PORT": "21080",
           "MQTT_HOST": "mqtt.plant.example"}


@pytest.fixture
def bare_shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A running stack noted with RUNNING; this process's environment a shell with none of them but one set
    otherwise."""
    monkeypatch.setattr(paths, "STATE_DIR", tmp_path)
    configuration.note(configuration.current(RUNNING))
    shell = {name: value for name, value in os.environ.items() if not configuration.is_setting(name)}
    shell["SPARK_MASTER_HOST"] = "127.0.0.1"
    monkeypatch.setattr(os, "environ", shell)
    return shell


def test_without_the_running_settings_the_shell_probes_loopback(bare_shell: dict[str, str]) -> None:
    assert kafka_cluster.KafkaNode(2).bootstrap_servers == "127.0.0.1:9094"  # what status probed before


def test_status_probes_the_nodes_and_the_master_by_the_running_stacks_hosts(
        bare_shell: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    named = configuration.take_noted()

    assert named == ["SPARK_MASTER_HOST='spark.plant.example' (this shell: '127.0.0.1')"]
    assert [kafka_cluster.KafkaNode(n).bootstrap_servers for n in kafka_cluster.NODES] == [
        "198.18.0.11:9092", "kafka-2.plant.example:21094", "kafka-3.plant.example:9096"]
    assert kafka_cluster.bootstrap_servers() == ("198.18.0.11:9092,kafka-2.plant.example:21094,"
                                                 "kafka-3.plant.example:9096")
    asked: list[str] = []
    monkeypatch.setattr(spark_cluster, "_json", lambda url, _timeout_s: asked.append(url))
    spark_cluster.master_state()
    assert asked == ["http://spark.plant.example:21080/json"]
    assert "kafka-2.plant.example" in kafka_cluster.KafkaNode(2).certificate_hosts()
    assert "mqtt.plant.example" in services.mosquitto_certificate_hosts()
