"""`up` checks each port free where its server will listen (the address a setting names, or every address), not on
127.0.0.1 alone: a port held on the node's address was called free, one held on loopback only was called taken for
a server that listens elsewhere. Real sockets on Linux's loopback 127.0.0.0/8."""
from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline_core import paths
from stack import kafka_cluster, manager, processes, services, spark_cluster, supervision
from stack.processes import StackError

NOT_HERE = "192.0.2.1"  # TEST-NET-1 (RFC 5737): never an address of this host


@pytest.fixture
def held_on_second_loopback() -> Iterator[int]:
    """A port listened on at 127.0.0.2 only."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.2", 0))
        listener.listen()
        yield listener.getsockname()[1]


def test_a_port_held_on_one_address_is_taken_there_and_for_every_address_only(held_on_second_loopback: int) -> None:
    port = held_on_second_loopback
    assert not processes.port_is_free(port, "127.0.0.2")
    assert not processes.port_is_free(port, "0.0.0.0")
    assert processes.port_is_free(port, "127.0.0.1")  # what `up` asked of every server before


def test_an_address_of_no_interface_here_is_said_so(held_on_second_loopback: int) -> None:
    with pytest.raises(StackError, match=f"{NOT_HERE} is no address of this host"):
        processes.port_is_free(held_on_second_loopback, NOT_HERE)


def test_each_server_names_the_address_it_listens_on(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MQTT_TLS_HOST", "SPARK_MASTER_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KAFKA_NODE2_HOST", "127.0.0.2")
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.3")
    assert services.Mosquitto().bind_host("mqtt") == "127.0.0.1"  # its listener for this host's stages
    assert services.Mosquitto().bind_host("mqtt-tls") == "0.0.0.0"
    monkeypatch.setenv("MQTT_TLS_HOST", "127.0.0.5")
    assert services.Mosquitto().bind_host("mqtt-tls") == "127.0.0.5"
    assert services.Kafka().bind_host("kafka") == services.InfluxDB().bind_host("http") == "127.0.0.1"
    node = kafka_cluster.KafkaNode(2)
    assert [node.bind_host(role) for role in node.ports()] == ["127.0.0.2", "127.0.0.2"]
    assert spark_cluster.SparkMaster().bind_host("master") == "127.0.0.3"  # SPARK_MASTER_HOST unset: the local IP
    monkeypatch.setenv("SPARK_MASTER_HOST", "127.0.0.4")
    assert spark_cluster.SparkMaster().bind_host("master") == "127.0.0.4"
    assert spark_cluster.SparkMaster().bind_host("ui") == spark_cluster.SparkWorker(1).bind_host("ui") == "127.0.0.3"


class Listener(services.Service):
    """A service that listens on 127.0.0.2; never started here."""

    name = "bind-host-probe"

    def __init__(self, port: int) -> None:
        self.port = port

    def ports(self) -> dict[str, int]:
        return {"server": self.port}

    def bind_host(self, role: str) -> str:
        return "127.0.0.2"

    def command(self) -> list[str]:
        raise AssertionError("not to be started: its port is taken")

    def is_ready(self, pid: int | None = None) -> bool:
        return False


def test_up_refuses_a_server_whose_port_is_held_where_it_listens(
        held_on_second_loopback: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paths, "STATE_DIR", tmp_path)
    monkeypatch.setattr(supervision, "process_info", lambda _name: supervision.NOT_RUNNING)
    with pytest.raises(StackError, match=f"port {held_on_second_loopback} \\(bind-host-probe server\\) is already "
                                         "in use"):
        manager.start_together([Listener(held_on_second_loopback)])
