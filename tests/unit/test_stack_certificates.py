"""The stack's server certificates hold the names other hosts reach the servers by (TLS_EXTRA_HOSTNAMES, and for
Mosquitto the MQTT_HOST clients are told and the MQTT_TLS_HOST it binds): one the stack made is made again when a
wanted name is missing; one given to the stack is used as it is, the missing
names logged. Real `openssl`, real certificates."""
from __future__ import annotations

import logging
import shutil
import socket
from pathlib import Path

import pytest

from pipeline_core import paths
from stack import certificates, services

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is a stack requirement")


def test_a_made_certificate_holds_the_extra_names_and_is_made_again_for_a_new_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TLS_EXTRA_HOSTNAMES", "mqtt.plant.example, 198.18.0.7")
    first = certificates.ensure_server_certificate("mosquitto", ["127.0.0.1", "localhost"], tmp_path)
    assert certificates.certificate_names(first.certificate) == [
        "127.0.0.1", "localhost", "mqtt.plant.example", "198.18.0.7"]
    issued = first.certificate.read_bytes()

    certificates.ensure_server_certificate("mosquitto", ["127.0.0.1", "localhost"], tmp_path)
    assert first.certificate.read_bytes() == issued  # every name there: kept

    monkeypatch.setenv("TLS_EXTRA_HOSTNAMES", "broker-2.plant.example")
    again = certificates.ensure_server_certificate("mosquitto", ["127.0.0.1", "localhost"], tmp_path)
    assert "broker-2.plant.example" in certificates.certificate_names(again.certificate)
    assert again.keystore.read_text().endswith(again.certificate.read_text())
    assert again.keystore.stat().st_mode & 0o077 == 0


def test_a_given_certificate_is_kept_and_its_missing_names_are_logged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    given = certificates.ensure_server_certificate("kafka", ["127.0.0.1"], tmp_path)
    (tmp_path / "kafka.hosts").unlink()  # as a certificate put there by hand has no record of the stack's
    issued = given.certificate.read_bytes()
    monkeypatch.setenv("TLS_EXTRA_HOSTNAMES", "kafka.plant.example")
    with caplog.at_level(logging.WARNING, logger=certificates.__name__):
        kept = certificates.ensure_server_certificate("kafka", ["127.0.0.1"], tmp_path)
    assert kept.certificate.read_bytes() == issued
    assert "not valid for kafka.plant.example" in caplog.text


def test_mosquittos_certificate_names_the_host_clients_are_told_and_the_address_it_binds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MQTT_HOST", "mqtt.plant.example")
    monkeypatch.setenv("MQTT_TLS_HOST", "198.18.0.7")
    assert services.mosquitto_certificate_hosts() == [
        "127.0.0.1", "localhost", socket.gethostname(), "198.18.0.7", "mqtt.plant.example"]
    monkeypatch.setenv("MQTT_TLS_HOST", "0.0.0.0")  # every address: no name of its own
    monkeypatch.setenv("MQTT_HOST", "127.0.0.1")
    assert services.mosquitto_certificate_hosts() == ["127.0.0.1", "localhost", socket.gethostname()]


def test_mosquittos_certificate_made_before_mqtt_host_was_set_is_made_again_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paths, "STATE_DIR", tmp_path)
    for name in ("STACK_TLS_CERT_FILE", "MQTT_HOST", "MQTT_TLS_HOST", "TLS_EXTRA_HOSTNAMES"):
        monkeypatch.delenv(name, raising=False)
    before = services.tls_files()
    assert "mqtt.plant.example" not in certificates.certificate_names(before.cert_file)
    issued = before.cert_file.read_bytes()

    monkeypatch.setenv("MQTT_HOST", "mqtt.plant.example")
    after = services.tls_files()
    assert after.cert_file == before.cert_file and after.cert_file.read_bytes() != issued
    assert "mqtt.plant.example" in certificates.certificate_names(after.cert_file)
    assert after.ca_file == certificates.ca_file()  # signed by the same CA: clients keep trusting it


def test_a_certificate_given_to_mosquitto_is_used_as_it_is_and_the_declared_names_it_lacks_are_logged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(paths, "STATE_DIR", tmp_path / "state")
    given = certificates.ensure_server_certificate("broker", ["127.0.0.1", "mqtt.plant.example"], tmp_path)
    issued = given.certificate.read_bytes()
    monkeypatch.setenv("STACK_TLS_CERT_FILE", str(given.certificate))
    monkeypatch.setenv("MQTT_HOST", "mqtt.plant.example")
    monkeypatch.setenv("MQTT_TLS_HOST", "0.0.0.0")
    monkeypatch.setenv("TLS_EXTRA_HOSTNAMES", "198.18.0.7")
    with caplog.at_level(logging.WARNING, logger=services.__name__):
        files = services.tls_files()
    assert files.cert_file == given.certificate and given.certificate.read_bytes() == issued
    assert not (tmp_path / "state" / "tls" / "mosquitto.pem").exists()
    assert "is not valid for 198.18.0.7: clients" in caplog.text  # mqtt.plant.example it holds; 0.0.0.0 is no name
