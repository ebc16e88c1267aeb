"""A private secure single stack with Mosquitto's TLS listener (SECURITY=on, STACK_TLS=on), started with names other
hosts reach it by: MQTT_HOST (the host clients are told) and TLS_EXTRA_HOSTNAMES. A certificate the stack made
before those names were set is made again at `up`, and a TLS client that verifies the broker against the stack's
CA connects by each of them, and is refused by a name that was never configured. `status` from a shell without
the stack's settings (and with another INFLUXDB_HOST) finds every server healthy, and `rotate-credential` from a
shell with another KAFKA_PORT rotates the password on the stack's Kafka."""
from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stack import certificates
from stack.topology import SINGLE_PORTS, private_ports
from support import private_port_range, wait_for

pytestmark = pytest.mark.integration

SERVERS = ["mosquitto", "kafka", "influxdb"]
MQTT_HOST = "127.0.0.2"  # loopback on Linux too, but no name the stack gives its certificates by itself
EXTRA_NAME = "mqtt.plant.example"
NEVER_CONFIGURED = "127.0.0.4"
# An anonymous MQTT 3.1.1 CONNECT (clean session, keepalive 5 s, client id "tls-names").
CONNECT = bytes([0x10, 21]) + b"\x00\x04MQTT\x04\x02\x00\x05" + b"\x00\x09tls-names"


class SecureStack:
    def __init__(self, state_dir: Path) -> None:
        ports = private_ports(SINGLE_PORTS + ("MQTT_TLS_PORT",), private_port_range())
        self.state_dir = state_dir
        self.tls_port = ports["MQTT_TLS_PORT"]
        # No KAFKA_BOOTSTRAP_SERVERS: the stack's own Kafka is at KAFKA_PORT.
        self.env = {**{name: value for name, value in os.environ.items()
                       if name not in ("MQTT_HOST", "MQTT_TLS_HOST", "TLS_EXTRA_HOSTNAMES", "STACK_TLS_CERT_FILE",
                                       "KAFKA_BOOTSTRAP_SERVERS")},
                    **{name: str(port) for name, port in ports.items()}, "STACK_STATE_DIR": str(state_dir),
                    "SECURITY": "on",
                    "STACK_TLS": "on", "MQTT_HOST": MQTT_HOST, "TLS_EXTRA_HOSTNAMES": EXTRA_NAME,
                    "INFLUXDB_HOST": "localhost"}

    def run(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "stack", *args], env=env or self.env, capture_output=True,
                              text=True, timeout=240)


@pytest.fixture(scope="module")
def stale_certificate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SecureStack, bytes]]:
    """The stack, after Mosquitto's certificate was made for this host's loopback names alone; then `up`."""
    stack = SecureStack(tmp_path_factory.mktemp("tls-names") / "state")
    made = certificates.ensure_server_certificate("mosquitto", ["127.0.0.1", "localhost"], stack.state_dir / "tls")
    assert MQTT_HOST not in certificates.certificate_names(made.certificate)
    issued = made.certificate.read_bytes()
    try:
        up = stack.run("up", "--servers-only")
        assert up.returncode == 0, up.stdout + up.stderr
        yield stack, issued
    finally:
        stack.run("down")


def mqtt_over_tls(stack: SecureStack, address: str, server_name: str) -> bytes:
    """The broker's answer to an anonymous CONNECT over TLS to `address`, verifying its certificate for
    `server_name` against the stack's CA."""
    context = ssl.create_default_context(cafile=str(stack.state_dir / "tls" / "ca.pem"))
    with socket.create_connection((address, stack.tls_port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname=server_name) as tls:
            tls.sendall(CONNECT)
            return tls.recv(4)


def test_a_certificate_made_before_the_names_were_set_is_made_again_at_up(stale_certificate) -> None:
    stack, issued = stale_certificate
    certificate = stack.state_dir / "tls" / "mosquitto.pem"
    assert certificate.read_bytes() != issued
    names = certificates.certificate_names(certificate)
    assert MQTT_HOST in names and EXTRA_NAME in names and "127.0.0.1" in names


def test_a_verifying_tls_client_reaches_mosquitto_by_each_configured_name_only(stale_certificate) -> None:
    stack, _issued = stale_certificate
    # CONNACK, "not authorised": the broker itself answered, over a verified TLS session.
    assert mqtt_over_tls(stack, MQTT_HOST, MQTT_HOST) == b"\x20\x02\x00\x05"
    assert mqtt_over_tls(stack, "127.0.0.1", EXTRA_NAME) == b"\x20\x02\x00\x05"
    with pytest.raises(ssl.SSLCertVerificationError, match="IP address mismatch"):
        mqtt_over_tls(stack, NEVER_CONFIGURED, NEVER_CONFIGURED)


def test_status_from_a_shell_without_the_stacks_host_settings_probes_what_runs(stale_certificate) -> None:
    stack, _issued = stale_certificate
    shell = {name: value for name, value in stack.env.items()
             if name not in ("MQTT_HOST", "TLS_EXTRA_HOSTNAMES", "STACK_TLS") and not name.endswith("_PORT")} | {"INFLUXDB_HOST": "127.0.0.9"}

    def healthy() -> subprocess.CompletedProcess[str] | None:
        done = stack.run("status", env=shell)
        rows = [line.split() for line in done.stdout.splitlines()[1:len(SERVERS) + 1]]
        return done if [row[0] for row in rows] == SERVERS and all("healthy" in row for row in rows) else None

    done = wait_for(healthy, 30, "status from a bare shell to find every server healthy", interval_s=1)
    assert f"mqtt-tls {stack.tls_port}" in done.stdout  # the running stack's TLS listener, from its settings
    assert "does not answer" not in done.stdout  # InfluxDB asked where the stack runs it, not at 127.0.0.9
    assert "INFLUXDB_HOST='localhost' (this shell: '127.0.0.9')" in done.stderr


def test_rotate_credential_from_a_shell_with_another_kafka_port_acts_on_the_running_stack(stale_certificate) -> None:
    stack, _issued = stale_certificate
    credentials_file = stack.state_dir / "credentials.env"
    before = credentials_file.read_text()
    shell = {name: value for name, value in stack.env.items() if not name.endswith("_PORT")} | {"KAFKA_PORT": "1"}
    done = subprocess.run([sys.executable, "-m", "stack", "rotate-credential", "monitor"], env=shell,
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "monitor: new Kafka password set" in done.stdout
    assert f"KAFKA_PORT='{stack.env['KAFKA_PORT']}' (this shell: '1')" in done.stderr
    changed = [line.split("=", 1)[0] for line in set(credentials_file.read_text().splitlines())
               - set(before.splitlines())]
    assert changed == ["KAFKA_MONITOR_PASSWORD"]
