"""The network-namespace harness's plan, before any namespace exists: names, addresses and the hosts file."""
from __future__ import annotations

import ipaddress

import pytest

from stack import netns


def test_hosts_get_the_subnets_addresses_in_order() -> None:
    network = netns.Network("mdp", "198.19.4.0/24")
    assert [(host.name, str(host.address)) for host in network.hosts("kafka1", "kafka2", "influx")] == [
        ("kafka1", "198.19.4.1"), ("kafka2", "198.19.4.2"), ("influx", "198.19.4.3")]
    with pytest.raises(ValueError, match="3 hosts do not fit in 198.18.0.0/31"):
        netns.Network("mdp", "198.18.0.0/31").hosts("a", "b", "c")


def test_namespaces_are_named_by_prefix_and_host() -> None:
    network = netns.Network("mdp1")
    assert network.subnet == ipaddress.IPv4Network("198.18.0.0/24")
    assert (network.namespace("kafka1"), network.switch) == ("mdp1-kafka1", "mdp1-switch")
    assert netns.exec_prefix("mdp1-kafka1") == ["ip", "netns", "exec", "mdp1-kafka1"]


@pytest.mark.parametrize("prefix", ["", "mdp-1", "Mdp", "1mdp", "mdp/x", "m" * 33])
def test_a_prefix_that_could_match_another_runs_names_is_refused(prefix: str) -> None:
    """A hyphen would let one run's `<prefix>-` start another's names; an empty prefix would sweep every run."""
    with pytest.raises(ValueError, match="prefix"):
        netns.Network(prefix)
    with pytest.raises(ValueError, match="prefix"):
        netns.sweep(prefix)


@pytest.mark.parametrize("name", ["switch", "Kafka", "-a", "a_b", "a" * 64, ""])
def test_a_host_name_that_is_no_dns_label_or_names_the_switch_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="host name"):
        netns.Host(name, ipaddress.IPv4Address("198.18.0.1"))


def test_interface_names_fit_in_15_characters_however_long_the_host_name() -> None:
    network = netns.Network("mdp")
    hosts = [netns.Host("a" * 63, ipaddress.IPv4Address("198.18.0.1"))]
    harness = netns.Harness(network, hosts)
    assert harness.namespace("a" * 63) == "mdp-" + "a" * 63
    assert netns.bridge_port(0) == "p0"
    assert len(netns.bridge_port(65535)) <= 15
    with pytest.raises(ValueError, match="longer than 15"):
        netns.bridge_port(10 ** 15)


def test_every_host_resolves_localhost_and_every_host() -> None:
    hosts = netns.Network("mdp").hosts("kafka1", "kafka2")
    assert netns.hosts_file(hosts).splitlines() == [
        "127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback",
        "198.18.0.1\tkafka1", "198.18.0.2\tkafka2"]


def test_a_harness_refuses_hosts_outside_its_subnet_or_clashing() -> None:
    network = netns.Network("mdp", "198.18.1.0/24")
    with pytest.raises(ValueError, match="no host address of the run's subnet 198.18.1.0/24"):
        netns.Harness(network, [netns.Host("a", ipaddress.IPv4Address("198.18.0.5"))])
    with pytest.raises(ValueError, match="no host address"):
        netns.Harness(network, [netns.Host("a", ipaddress.IPv4Address("198.18.1.255"))])
    with pytest.raises(ValueError, match="two hosts named 'a'"):
        netns.Harness(network, network.hosts("a", "a"))
    with pytest.raises(ValueError, match="two hosts at 198.18.1.1"):
        netns.Harness(network, [netns.Host("a", ipaddress.IPv4Address("198.18.1.1")),
                                netns.Host("b", ipaddress.IPv4Address("198.18.1.1"))])


def test_a_fault_between_a_host_and_itself_or_an_unknown_host_is_refused() -> None:
    network = netns.Network("mdp")
    harness = netns.Harness(network, network.hosts("a", "b"))
    with pytest.raises(ValueError, match="between 'a' and itself"):
        harness.cut_between("a", "a")
    with pytest.raises(ValueError, match="no host 'c' in run mdp"):
        harness.isolate("c")
