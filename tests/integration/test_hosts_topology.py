"""TOPOLOGY=hosts from nothing: the cluster placed on ten hosts (network namespaces) by the inventory, every program
in its host's network stack, a short seeded storm of network faults with bad rows mixed in, exact against the
offline join; and after `down` nothing of it is left.

The storm (`hosts_support`): a Kafka node's host cut off from every other host, the stream connector's path to
Mosquitto cut, a DB connector's path to InfluxDB cut, and with Spark the driver's path to a worker's host cut, with
the standalone joiners the host of one of them cut off; each healed while the replay runs. Every fault is confirmed
from inside the hosts, and `make status` names the server that the operator cannot reach."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from chaos_support import REPO_ROOT, chaos_workdir
from stack import netns, placement

pytestmark = pytest.mark.integration


def _stack(env: dict[str, str], *args: str, timeout_s: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stack", *args], env=env, cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=timeout_s)


def _network_namespace(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


@pytest.mark.parametrize("joiner", ["spark"])
def test_the_cluster_across_hosts_survives_a_storm_of_network_faults_exactly(joiner: str) -> None:
    netns.preflight()  # root and `ip netns`, or a clear failure
    workdir = chaos_workdir(f"hosts-{joiner}")
    state_dir = workdir / "stack"
    prefix = f"h{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "TOPOLOGY": "hosts", "JOINER": joiner, "STACK_STATE_DIR": str(state_dir),
           "STACK_HOSTS_PREFIX": prefix}
    network = netns.Network(prefix, placement.inventory().subnet)
    try:
        up = _stack(env, "up")
        assert up.returncode == 0, up.stdout + up.stderr
        status = _stack(env, "status", "--json")
        assert status.returncode == 0, status.stderr
        document = json.loads(status.stdout)
        assert document["topology"] == "hosts"
        for service in document["services"]:
            assert service["health"] == "healthy", service
            host = placement.inventory().host_of(service["name"]).name
            assert _network_namespace(service["pid"]) == os.stat(f"/run/netns/{network.namespace(host)}").st_ino, \
                f"{service['name']} runs outside its host {host}"
        storm = _stack(env, "run", "--", sys.executable, str(REPO_ROOT / "tests" / "hosts_support.py"),
                       "--joiner", joiner, "--state-dir", str(state_dir), "--prefix", prefix, timeout_s=2400)
        assert storm.returncode == 0, storm.stdout[-5000:] + storm.stderr[-20000:]
        report = json.loads(storm.stdout.strip().splitlines()[-1])
        print(report["summary"])
        confirmed = report["confirmed"]
        assert any(line.startswith("isolate kafka-") and "cannot reach kafka-" in line for line in confirmed), confirmed
        assert sum(line.startswith(("cut ", "isolate ")) for line in confirmed) == 4, confirmed
        assert sum(line.startswith(("heal ", "rejoin ")) for line in confirmed) == 4, confirmed
    finally:
        down = _stack(env, "down", timeout_s=600)
    assert down.returncode == 0, down.stdout + down.stderr
    left = [name for name in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
            if name.startswith(f"{prefix}-")]
    assert not left, f"namespaces left after down: {left}"
    assert not list(Path("/etc/netns").glob(f"{prefix}-*")) if Path("/etc/netns").exists() else True
    assert not netns.owner_file(prefix).exists()
