"""TOPOLOGY=hosts: the cluster's programs placed on hosts by the inventory (`hosts.toml`), each host a network
namespace with its own address and name, running its part under a supervisord of its own.

The inventory decides everything host-specific: the settings every program and tool is given (each server's host
name: KAFKA_NODE<n>_HOST, MQTT_HOST, INFLUXDB_HOST, SPARK_MASTER_HOST), those of one host (its address as
SPARK_LOCAL_IP and INFLUXDB_BIND_HOST), and where `python -m stack` itself runs: on the operator host, so that its
health checks, `status` and the tools `make data` and `make report` run reach every server across the network,
by name, as a user's would."""
from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
import tomllib
from collections.abc import Collection, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pipeline_core import paths
from . import certificates, netns
from .choice import KAFKA_NODES, is_hosts
from .processes import StackError
from .services import Mosquitto

INVENTORY = Path(__file__).with_name("hosts.toml")
# The first part of each namespace's name (`<prefix>-<host>`); a stack beside another (a test's) takes its own.
PREFIX_ENV = "STACK_HOSTS_PREFIX"
DEFAULT_PREFIX = "mdp"


@dataclass(frozen=True)
class PlacedHost:
    name: str
    address: ipaddress.IPv4Address
    programs: tuple[str, ...]


@dataclass(frozen=True)
class Inventory:
    subnet: ipaddress.IPv4Network
    operator: str
    hosts: tuple[PlacedHost, ...]
    shared_storage: Mapping[str, str]  # path under the state dir -> who shares it

    def host(self, name: str) -> PlacedHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise StackError(f"the inventory has no host {name!r} (hosts: {', '.join(h.name for h in self.hosts)})")

    def host_of(self, program: str) -> PlacedHost:
        for host in self.hosts:
            if program in host.programs:
                return host
        raise StackError(f"the inventory ({INVENTORY}) places no host to run {program}")

    def server_host_name(self, program: str) -> str:
        return self.host_of(program).name


def parse_inventory(text: str, known_programs: set[str] | None = None) -> Inventory:
    """The inventory in `text` (TOML), checked: addresses in the subnet, which lies in 198.18.0.0/15; each
    program placed once; with `known_programs`, every one of them placed and nothing else."""
    document = tomllib.loads(text)
    try:
        network = netns.Network(DEFAULT_PREFIX, document["subnet"])
        hosts = tuple(PlacedHost(name, netns.Host(name, entry["address"]).address, tuple(entry.get("programs", ())))
                      for name, entry in document["hosts"].items())
    except (KeyError, TypeError, ValueError) as error:
        raise StackError(f"the inventory is not valid: {error}") from None
    for host in hosts:
        try:
            network.require_inside(host.address)
        except ValueError as error:
            raise StackError(f"host {host.name}: {error}") from None
    addresses = [host.address for host in hosts]
    if len(set(addresses)) != len(addresses):
        raise StackError("the inventory gives two hosts one address")
    placed = [program for host in hosts for program in host.programs]
    twice = sorted({program for program in placed if placed.count(program) > 1})
    if twice:
        raise StackError(f"the inventory places {', '.join(twice)} on more than one host")
    if known_programs is not None:
        missing, unknown = sorted(known_programs - set(placed)), sorted(set(placed) - known_programs)
        if missing or unknown:
            raise StackError("the inventory " + "; ".join(
                part for part in (f"places no host for {', '.join(missing)}" if missing else "",
                                  f"names programs the stack does not have: {', '.join(unknown)}" if unknown else "")
                if part))
    operator = document.get("operator", "")
    if operator not in {host.name for host in hosts}:
        raise StackError(f"the inventory's operator host {operator!r} is not one of its hosts")
    return Inventory(network.subnet, operator, hosts, dict(document.get("storage", {}).get("shared", {})))


@cache
def inventory() -> Inventory:
    return parse_inventory(INVENTORY.read_text())



def prefix() -> str:
    return netns.check_prefix(os.environ.get(PREFIX_ENV, DEFAULT_PREFIX))


def network() -> netns.Network:
    return netns.Network(prefix(), inventory().subnet)


def namespace(host: str) -> str:
    return network().namespace(host)


def operator_namespace() -> str:
    return namespace(inventory().operator)


def harness() -> netns.Harness:
    """The hosts' network, for faults on a running stack (isolate, cut_between): attached, never torn down by it."""
    return netns.Harness(network(), [netns.Host(host.name, host.address) for host in inventory().hosts])


def network_exists() -> bool:
    return netns.exists(operator_namespace())


# A test's stack names its own process here: should the test die without `down`, `netns.sweep_orphans` (run by
# the next test) removes the hosts it left.
GUARDIAN_PID_ENV = "STACK_HOSTS_GUARDIAN_PID"


def ensure_network(programs: set[str]) -> bool:
    """Build the hosts' namespaces unless they exist, once the inventory is found to place each of `programs` (the
    cluster's) and nothing else; True when built now."""
    if network_exists():
        return False
    parse_inventory(INVENTORY.read_text(), programs)
    netns.preflight()
    netns.sweep(prefix())  # what a stack killed halfway through its network's build left
    guardian = os.environ.get(GUARDIAN_PID_ENV)
    harness().build_lasting(owner=str(paths.STATE_DIR), guardian_pid=int(guardian) if guardian else None)
    return True


def remove_network() -> list[str]:
    """Remove the hosts' namespaces, every process left in them, and their names: what `down` leaves of the hosts."""
    return netns.sweep(prefix())


def inside_operator() -> bool:
    return netns.current_namespace_is(operator_namespace())


def run_on_operator(argv: list[str], extra_environment: Mapping[str, str] | None = None) -> int:
    """Run `argv` on the operator host (its network stack and /etc/hosts), with this process's environment (which
    holds the hosts' settings: `python -m stack` takes them first) and `extra_environment`; its exit code."""
    environment = {**os.environ, **(extra_environment or {})}
    return subprocess.run([*netns.exec_prefix(operator_namespace()), *argv], env=environment).returncode


def server_environment() -> dict[str, str]:
    """What every program and tool on the hosts is given: each server's host by name."""
    placed = inventory()
    mqtt = placed.host_of("mosquitto")
    return {
        **{f"KAFKA_NODE{n}_HOST": placed.server_host_name(f"kafka-{n}") for n in KAFKA_NODES},
        "MQTT_HOST": mqtt.name,
        # The TLS listener binds its host's address (the plain one stays on that host's loopback).
        "MQTT_TLS_HOST": str(mqtt.address),
        "INFLUXDB_HOST": placed.server_host_name("influxdb"),
        "SPARK_MASTER_HOST": placed.server_host_name("spark-master"),
    }


def host_environment(host: str) -> dict[str, str]:
    """Settings of the programs on `host`: its address, which Spark's processes and InfluxDB bind."""
    address = str(inventory().host(host).address)
    return {"SPARK_LOCAL_IP": address, "INFLUXDB_BIND_HOST": address}


def mqtt_client_environment() -> dict[str, str]:
    """An MQTT client on another host than Mosquitto's (the stream connector, the simulator): its TLS listener, by
    name, verified with the stack's CA."""
    return {"MQTT_HOST": inventory().server_host_name("mosquitto"),
            "MQTT_PORT": str(Mosquitto().ports()["mqtt-tls"]),
            "MQTT_TLS_CA_FILE": str(certificates.ca_file())}


@contextmanager
def on_host(program: str) -> Iterator[None]:
    """For the block, act as if on the host that runs `program`: its settings in the environment and the calling
    thread in its network namespace (a probe of 127.0.0.1 reaches that host's loopback). A no-op off the hosts."""
    if not is_hosts():
        yield
        return
    host = inventory().host_of(program).name
    overrides = host_environment(host)
    saved = {key: os.environ.get(key) for key in overrides}
    os.environ.update(overrides)
    try:
        with netns.entered(namespace(host)):
            yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def supervisor_command(host: str, config_file: Path) -> tuple[list[str], dict[str, str]]:
    """The command line that starts `host`'s supervisord in its namespace, and its environment."""
    return ([*netns.exec_prefix(namespace(host)), sys.executable, "-m", "supervisor.supervisord", "-c",
             str(config_file)], {**os.environ, **host_environment(host)})


# How long a probe of `status` waits for a server's port from each host: a cut path fails at once (unreachable
# routes), a host cut off times out.
PROBE_TIMEOUT_S = 1.0


def server_endpoints() -> list[tuple[str, str, int]]:
    """(program, host name, port) of each server the pipeline's programs connect to."""
    from . import kafka_cluster, spark_cluster
    from .services import InfluxDB
    placed = inventory()
    return [*((f"kafka-{n}", placed.server_host_name(f"kafka-{n}"), kafka_cluster.node_ports(n)["kafka"])
              for n in KAFKA_NODES),
            ("mosquitto", placed.server_host_name("mosquitto"), Mosquitto().ports()["mqtt-tls"]),
            ("influxdb", placed.server_host_name("influxdb"), InfluxDB().ports()["http"]),
            ("spark-master", placed.server_host_name("spark-master"), spark_cluster.master_port())]


def unreachable_from(host: str, endpoints: list[tuple[str, str, int]]) -> list[str]:
    """The servers among `endpoints` that a TCP connect from inside `host` does not reach."""
    unreachable = []
    with netns.entered(namespace(host)):
        for program, server_host, port in endpoints:
            try:
                socket.create_connection((server_host, port), timeout=PROBE_TIMEOUT_S).close()
            except OSError:
                unreachable.append(program)
    return unreachable


def host_lines(programs: Collection[str]) -> list[str]:
    """`status` on the hosts: each host, its address and programs, and which of the servers among `programs` (those
    of the stack that runs) it cannot reach now (all hosts probed at once)."""
    if not network_exists():
        return ["hosts: their network is not built (`make up TOPOLOGY=hosts` builds it)"]
    hosts = inventory().hosts
    endpoints = [endpoint for endpoint in server_endpoints() if endpoint[0] in programs]
    with ThreadPoolExecutor(len(hosts)) as pool:
        unreachable = list(pool.map(lambda host: unreachable_from(host.name, endpoints), hosts))
    return [f"host {host.name} ({host.address}): {', '.join(host.programs) or 'operator (status, data, report)'}; "
            + (f"cannot reach {', '.join(missing)}" if missing else "reaches every server")
            for host, missing in zip(hosts, unreachable)]
