"""A secure Mosquitto and InfluxDB, configured as `python -m stack up` configures them when the stack has a
credentials file, on a private state dir and ports: each principal is refused what it must not do, and
does what it must."""
from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from influxdb import InfluxDBClient
from influxdb.exceptions import InfluxDBClientError
from paho.mqtt.enums import MQTTErrorCode, MQTTProtocolVersion

from db_connector.writer import InfluxWriter
from pipeline_core import credentials, paths
from pipeline_core.influx_retention import RAW_POLICY, RetentionSettings
from pipeline_core.mqtt import DEVICE_CLIENT_ID, new_client, pump
from pipeline_core.settings import MACHINE_STATES_TOPIC, InfluxSettings, MqttSettings, load_settings
from connector_support import run_simulator
from conftest import EVENTS_FILE
from stack import influxdb_users
from stack.__main__ import loss_line
from stack.services import InfluxDB, Mosquitto, Service
from stack.processes import free_loopback_ports
from support import unique, wait_for

pytestmark = pytest.mark.integration

CONNECTOR = "stream-connector"
DEADLINE_S = 15.0


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA, and a server certificate for 127.0.0.1 signed by it: (cert, key, CA) files."""
    cert, key, ca, ca_key, request = (directory / name for name in
                                      ("server.crt", "server.key", "ca.crt", "ca.key", "server.csr"))

    def openssl(*args: object) -> None:
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
            "-subj", "/CN=test CA", "-keyout", ca_key, "-out", ca)
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", key, "-out", request)
    openssl("x509", "-req", "-in", request, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-days", "1",
            "-extfile", _write(directory / "san.ext", "subjectAltName=IP:127.0.0.1\n"), "-out", cert)
    return cert, key, ca


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@dataclasses.dataclass(frozen=True)
class SecureServers:
    values: dict[str, str]
    mqtt: MqttSettings
    mqtt_tls: MqttSettings
    influx: InfluxSettings

    def mqtt_as(self, user: str | None, password: str | None = None) -> MqttSettings:
        if user and password is None:
            password = self.values[credentials.mqtt_password_key(user)]
        return dataclasses.replace(self.mqtt, mqtt_username=user, mqtt_password=password)

    def influx_as(self, user: str | None) -> InfluxDBClient:
        password = self.values[credentials.influxdb_password_key(user)] if user else None
        return InfluxDBClient(self.influx.influxdb_host, self.influx.influxdb_port, username=user,
                              password=password, database=self.influx.influxdb_database, timeout=10)


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureServers]:
    """Mosquitto (with a TLS listener) and InfluxDB of a secure stack, run here until the module ends."""
    state_dir = tmp_path_factory.mktemp("secure") / "state"
    tls_dir = tmp_path_factory.mktemp("tls")
    cert, key, ca = _certificates(tls_dir)
    mqtt_port, mqtt_tls_port, influx_port, rpc_port = free_loopback_ports(4)
    running: list[subprocess.Popen] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(paths, "STATE_DIR", state_dir)
        for name, value in {"STACK_STATE_DIR": state_dir, credentials.CREDENTIALS_FILE_ENV: state_dir / "credentials.env",
                            "MQTT_PORT": mqtt_port, "MQTT_TLS_PORT": mqtt_tls_port, "MQTT_TLS_HOST": "127.0.0.1",
                            "STACK_TLS": "on", "STACK_TLS_CERT_FILE": cert, "STACK_TLS_KEY_FILE": key,
                            "STACK_TLS_CA_FILE": ca, "INFLUXDB_PORT": influx_port,
                            "INFLUXDB_RPC_PORT": rpc_port}.items():
            patch.setenv(name, str(value))
        values = credentials.ensure_credentials()
        try:
            for server in (Mosquitto(), InfluxDB()):
                running.append(_start(server))
            mqtt_settings = MqttSettings(mqtt_port=mqtt_port)
            yield SecureServers(values, mqtt_settings,
                                dataclasses.replace(mqtt_settings, mqtt_port=mqtt_tls_port, mqtt_tls_ca_file=ca),
                                InfluxSettings(influxdb_port=influx_port, influxdb_database="machinedata"))
        finally:
            for process in running:
                process.terminate()
                process.wait(30)


def _start(server: Service) -> subprocess.Popen:
    server.prepare()
    server.state_dir.mkdir(parents=True, exist_ok=True)
    with server.log_file.open("ab") as log:
        process = subprocess.Popen(server.command(), stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: process.poll() is not None or server.is_ready(), 60, f"{server.name} to answer")
        assert process.poll() is None, f"{server.name} exited: {server.log_file.read_text()[-2000:]}"
        server.after_ready()
    except BaseException:
        process.kill()
        process.wait()
        raise
    return process


class Session:
    """One MQTT connection driven from the test's thread, recording what the broker answers."""

    def __init__(self, settings: MqttSettings, client_id: str, *, clean: bool = True,
                 protocol: MQTTProtocolVersion = MQTTProtocolVersion.MQTTv311) -> None:
        v5 = protocol == MQTTProtocolVersion.MQTTv5
        self.client = new_client(settings, client_id, protocol=protocol, clean_session=None if v5 else clean)
        self.connack: list[int] = []
        self.granted: list[int] = []
        self.acked: dict[int, int] = {}
        self.received: list[bytes] = []
        self.client.on_connect = lambda _c, _u, _f, reason, _p: self.connack.append(reason.value)
        self.client.on_subscribe = lambda _c, _u, _m, reasons, _p: self.granted.extend(r.value for r in reasons)
        self.client.on_publish = lambda _c, _u, mid, reason, _p: self.acked.__setitem__(mid, reason.value)
        self.client.on_message = lambda _c, _u, message: self.received.append(message.payload)
        self.client.connect(settings.mqtt_host, settings.mqtt_port)  # MQTT 5: a clean start

    def wait_connack(self) -> int:
        """The CONNACK's reason code (0: accepted), or -1 when the broker closed the connection first."""
        wait_for(lambda: self.connack or self._closed(), DEADLINE_S, "a CONNACK")
        return self.connack[0] if self.connack else -1

    def _closed(self) -> bool:
        return pump(self.client, 0.05) != MQTTErrorCode.MQTT_ERR_SUCCESS and not self.connack

    def pump_until(self, done, what: str) -> None:
        wait_for(lambda: pump(self.client, 0.05) == MQTTErrorCode.MQTT_ERR_SUCCESS and done(), DEADLINE_S, what)

    def subscribe(self, topic: str) -> int:
        self.client.subscribe(topic, qos=1)
        self.pump_until(lambda: self.granted, f"a SUBACK for {topic}")
        return self.granted.pop()

    def publish(self, topic: str, payload: bytes) -> int:
        mid = self.client.publish(topic, payload, qos=1).mid
        self.pump_until(lambda: mid in self.acked, f"the PUBACK of {topic}")
        return self.acked[mid]

    def close(self) -> None:
        self.client.disconnect()
        pump(self.client, 0.1)


def _connack(settings: MqttSettings, client_id: str, **options: object) -> int:
    session = Session(settings, client_id, **options)
    try:
        return session.wait_connack()
    finally:
        session.close()


# paho reports MQTT 3.1.1's CONNACK codes as MQTT 5 reason codes: 5 "not authorised" as 0x87,
# 4 "bad user name or password" as 0x86. -1: the broker closed the connection without one.
REFUSED = {0x86, 0x87, -1}
SUBACK_FAILURE_V311 = 0x80
NOT_AUTHORIZED_V5 = 0x87


def test_mqtt_refuses_anonymous_wrong_passwords_and_unknown_users(secure: SecureServers) -> None:
    assert _connack(secure.mqtt_as(None), unique("anonymous")) in REFUSED
    assert _connack(secure.mqtt_as("device", "wrong"), DEVICE_CLIENT_ID) in REFUSED
    assert _connack(secure.mqtt_as("somebody", "x"), unique("somebody")) in REFUSED
    # The device's credentials are bound to its one client id.
    assert _connack(secure.mqtt_as("device"), unique("device")) in REFUSED
    assert _connack(secure.mqtt_as("device"), DEVICE_CLIENT_ID) == 0


def test_device_publishes_machine_states_only_and_the_connector_alone_reads_them(secure: SecureServers) -> None:
    connector_id = unique(CONNECTOR)
    connector = Session(secure.mqtt_as(CONNECTOR), connector_id, clean=False)
    assert connector.wait_connack() == 0
    assert connector.subscribe(MACHINE_STATES_TOPIC) == 1
    device = Session(secure.mqtt_as("device"), DEVICE_CLIENT_ID, protocol=MQTTProtocolVersion.MQTTv5)
    assert device.wait_connack() == 0
    try:
        # Subscribing is refused to the device, to everything and to the machine states alike.
        assert device.subscribe("#") == NOT_AUTHORIZED_V5
        assert device.subscribe(f"{MACHINE_STATES_TOPIC}/#") == NOT_AUTHORIZED_V5
        # Publishing outside the machine states is refused (MQTT 5 says so in the PUBACK).
        assert device.publish("other/topic", b"outside") == NOT_AUTHORIZED_V5
        assert device.publish(f"{MACHINE_STATES_TOPIC}-x", b"beside") == NOT_AUTHORIZED_V5
        row = unique("row").encode()
        assert device.publish(MACHINE_STATES_TOPIC, row) == 0
        connector.pump_until(lambda: row in connector.received, "the row at the connector")
        assert connector.received == [row], "only the machine state reached the connector"
    finally:
        device.close()
        connector.close()
    # The connector may use its shard's ids, but only for the machine states.
    shard = Session(secure.mqtt_as(CONNECTOR), f"{CONNECTOR}-3")
    assert shard.wait_connack() == 0
    assert shard.subscribe("other/#") == SUBACK_FAILURE_V311
    shard.close()


def test_no_other_user_takes_the_connectors_client_id(secure: SecureServers) -> None:
    connector_id = unique(CONNECTOR)
    connector = Session(secure.mqtt_as(CONNECTOR), connector_id, clean=False)
    assert connector.wait_connack() == 0
    assert connector.subscribe(MACHINE_STATES_TOPIC) == 1
    connector.close()
    queued = unique("queued").encode()
    device = Session(secure.mqtt_as("device"), DEVICE_CLIENT_ID)
    assert device.wait_connack() == 0
    assert device.publish(MACHINE_STATES_TOPIC, queued) == 0
    device.close()
    # With a clean session, taking the id would wipe the rows queued for the connector.
    assert _connack(secure.mqtt_as("device"), connector_id) in REFUSED
    assert _connack(secure.mqtt_as("device"), CONNECTOR) in REFUSED
    assert _connack(secure.mqtt_as(None), connector_id) in REFUSED
    resumed = Session(secure.mqtt_as(CONNECTOR), connector_id, clean=False)
    try:
        assert resumed.wait_connack() == 0
        resumed.pump_until(lambda: queued in resumed.received, "the queued row after the attempts")
    finally:
        resumed.close()
        _connack(secure.mqtt_as(CONNECTOR), connector_id, clean=True)  # leave no session behind


def test_make_data_publishes_as_the_device(secure: SecureServers) -> None:
    """`python -m simulator` takes the device's identity from the credentials file, nothing given."""
    topic = f"{MACHINE_STATES_TOPIC}/{unique('simulator')}"
    connector = Session(secure.mqtt_as(CONNECTOR), unique(CONNECTOR))
    try:
        assert connector.wait_connack() == 0 and connector.subscribe(topic) == 1
        result = run_simulator(topic, "--events-file", str(EVENTS_FILE), "--limit", "20")
        assert result.returncode == 0 and "published 20 rows" in result.stdout, result.stdout + result.stderr
        connector.pump_until(lambda: len(connector.received) >= 20, "the simulator's 20 rows")
    finally:
        connector.close()


def test_mqtt_over_tls_with_the_same_users(secure: SecureServers) -> None:
    def over_tls(user: str | None) -> MqttSettings:
        password = secure.values[credentials.mqtt_password_key(user)] if user else None
        return dataclasses.replace(secure.mqtt_tls, mqtt_username=user, mqtt_password=password)

    assert _connack(over_tls(None), unique("anonymous")) in REFUSED
    connector_id = unique(CONNECTOR)
    connector = Session(over_tls(CONNECTOR), connector_id)
    device = Session(over_tls("device"), DEVICE_CLIENT_ID)
    try:
        assert connector.wait_connack() == 0 and device.wait_connack() == 0
        assert connector.subscribe(MACHINE_STATES_TOPIC) == 1
        rows = [unique("tls").encode() for _ in range(50)]
        for row in rows:
            assert device.publish(MACHINE_STATES_TOPIC, row) == 0
        connector.pump_until(lambda: connector.received == rows, "the rows over TLS, in order")
    finally:
        device.close()
        connector.close()


def test_influxdb_users_have_their_privilege_only(secure: SecureServers) -> None:
    with pytest.raises(InfluxDBClientError) as anonymous:
        InfluxDBClient(secure.influx.influxdb_host, secure.influx.influxdb_port,
                       database="machinedata", timeout=10).query('SELECT * FROM "pipeline_health"')
    assert anonymous.value.code == 401
    writer, reader = secure.influx_as("writer"), secure.influx_as("reader")
    line = f"security_check,test={unique('t')} value=1i"
    # As the DB connector writes: it may not create the database, which the admin made.
    db_writer = InfluxWriter(writer, "machinedata", load_settings(RetentionSettings, []))
    db_writer.ensure_database()
    assert db_writer.write([line], RAW_POLICY) == [] and db_writer.retries == 0
    assert list(reader.query('SELECT count("value") FROM "raw"."security_check"').get_points())[0]["count"] >= 1
    with pytest.raises(InfluxDBClientError) as reader_writes:
        reader.write_points([line], protocol="line")
    assert reader_writes.value.code == 403
    with pytest.raises(InfluxDBClientError) as writer_drops:
        writer.query('DROP DATABASE "machinedata"', method="POST")
    assert writer_drops.value.code == 403
    with pytest.raises(InfluxDBClientError) as writer_reads:
        writer.query('SELECT count("value") FROM "raw"."security_check"')
    assert writer_reads.value.code == 403
    assert "machinedata" in [row["name"] for row in secure.influx_as("admin").get_list_database()]
    # `make status` reads the stages' losses as the reader.
    assert loss_line().endswith("none")


def test_influxdb_passwords_rotate(secure: SecureServers, monkeypatch: pytest.MonkeyPatch) -> None:
    """A password changed in the credentials file: writer's is taken on the next start, the admin's by
    `python -m stack.influxdb_users` (which asks for the old one)."""
    def rotate(to: dict[str, str], old_admin: str) -> None:
        credentials.write_credentials(to)
        monkeypatch.setattr(influxdb_users.getpass, "getpass", lambda _prompt: old_admin)
        assert influxdb_users.main() == 0
        InfluxDB().after_ready()  # what the next start does

    admin_key, writer_key = credentials.influxdb_password_key("admin"), credentials.influxdb_password_key("writer")
    rotated = {**secure.values, admin_key: unique("admin"), writer_key: unique("writer")}
    rotate(rotated, secure.values[admin_key])
    try:
        with pytest.raises(InfluxDBClientError) as old_password:
            secure.influx_as("writer").write_points(["rotation value=1i"], protocol="line")
        assert old_password.value.code == 401
        assert dataclasses.replace(secure, values=rotated).influx_as("writer").write_points(
            ["rotation value=1i"], protocol="line")
    finally:
        rotate(secure.values, rotated[admin_key])
