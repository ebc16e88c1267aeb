"""The inventory of TOPOLOGY=hosts (ops/stack/hosts.toml): what it must place, and what it refuses."""
from __future__ import annotations

import pytest

from stack import placement
from stack.processes import StackError
from stack.topology import every_cluster_service

PROGRAMS = {service.name for service in every_cluster_service()}


def inventory_text(hosts: str, subnet: str = "198.18.0.0/24", operator: str = "ops") -> str:
    return f'subnet = "{subnet}"\noperator = "{operator}"\n[hosts.ops]\naddress = "198.18.0.2"\n' + hosts


def test_the_shipped_inventory_places_every_program_of_the_cluster_once() -> None:
    inventory = placement.parse_inventory(placement.INVENTORY.read_text(), PROGRAMS)
    assert sorted(program for host in inventory.hosts for program in host.programs) == sorted(PROGRAMS)
    assert len(inventory.hosts) >= 5


def test_each_fault_of_the_suite_cuts_a_real_network_path() -> None:
    inventory = placement.parse_inventory(placement.INVENTORY.read_text(), PROGRAMS)
    host = lambda program: inventory.host_of(program).name  # noqa: E731
    assert len({host(f"kafka-{n}") for n in (1, 2, 3)}) == 3
    assert host("spark-joiner") not in {host("spark-worker-1"), host("spark-worker-2")}
    assert host("stream-connector") != host("mosquitto")
    assert host("influxdb") not in {host("db-connector-1"), host("db-connector-2")}
    assert host("lsb-joiner-1") != host("lsb-joiner-2")
    assert not inventory.host(inventory.operator).programs


@pytest.mark.parametrize(("hosts", "refusal"), [
    ('[hosts.a]\naddress = "10.0.0.5"\nprograms = ["mosquitto"]\n', "outside"),
    ('[hosts.a]\naddress = "198.18.1.5"\nprograms = ["mosquitto"]\n', "no host address"),
    ('[hosts.a]\naddress = "198.18.0.2"\nprograms = ["mosquitto"]\n', "two hosts one address"),
    ('[hosts.a]\naddress = "198.18.0.3"\nprograms = ["mosquitto"]\n[hosts.b]\naddress = "198.18.0.4"\n'
     'programs = ["mosquitto"]\n', "more than one host"),
    ('[hosts.A_B]\naddress = "198.18.0.3"\nprograms = []\n', "host name"),
])
def test_an_inventory_that_would_touch_other_addresses_or_place_twice_is_refused(hosts: str, refusal: str) -> None:
    with pytest.raises(StackError, match=refusal):
        placement.parse_inventory(inventory_text(hosts))


def test_a_program_left_unplaced_or_unknown_is_named() -> None:
    text = inventory_text('[hosts.a]\naddress = "198.18.0.3"\nprograms = ["mosquitto", "grafana"]\n')
    with pytest.raises(StackError) as refused:
        placement.parse_inventory(text, {"mosquitto", "influxdb"})
    assert "places no host for influxdb" in str(refused.value) and "grafana" in str(refused.value)


def test_the_operator_must_be_one_of_the_hosts() -> None:
    with pytest.raises(StackError, match="operator host 'elsewhere'"):
        placement.parse_inventory(inventory_text("", operator="elsewhere"))


def test_every_program_is_given_each_server_s_host_by_name_and_each_host_its_address() -> None:
    environment = placement.server_environment()
    inventory = placement.inventory()
    assert environment["KAFKA_NODE2_HOST"] == inventory.host_of("kafka-2").name
    assert environment["MQTT_HOST"] == inventory.host_of("mosquitto").name
    assert environment["MQTT_TLS_HOST"] == str(inventory.host_of("mosquitto").address)
    assert environment["INFLUXDB_HOST"] == inventory.host_of("influxdb").name
    assert environment["SPARK_MASTER_HOST"] == inventory.host_of("spark-master").name
    worker = inventory.host_of("spark-worker-1")
    assert placement.host_environment(worker.name)["SPARK_LOCAL_IP"] == str(worker.address)
