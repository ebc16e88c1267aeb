"""The credentials file: generated once at random, owner-only, never a placeholder."""
from __future__ import annotations

import stat
from pathlib import Path

from pipeline_core import credentials


def test_generated_once_owner_only_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "state" / "credentials.env"
    first = credentials.ensure_credentials(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert set(credentials.password_keys()) <= set(first)
    assert len(set(first[key] for key in credentials.password_keys())) == len(credentials.password_keys())
    assert credentials.ensure_credentials(path) == first
    assert credentials.placeholders(first) == []


def test_placeholders_are_named(tmp_path: Path) -> None:
    values = {key: "secret" for key in credentials.password_keys()}
    values["KAFKA_ADMIN_PASSWORD"] = "change-me-kafka"
    del values["MQTT_DEVICE_PASSWORD"]
    assert credentials.placeholders(values) == ["KAFKA_ADMIN_PASSWORD", "MQTT_DEVICE_PASSWORD"]


def test_environment_of_a_principal_and_the_environment_wins(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "credentials.env"
    values = credentials.ensure_credentials(path, extra={"KAFKA_SECURITY_PROTOCOL": "SASL_SSL"})
    monkeypatch.setenv(credentials.CREDENTIALS_FILE_ENV, str(path))
    env = credentials.environ_for("db-connector", {"INFLUXDB_USERNAME": "someone"})
    assert env["KAFKA_SASL_USERNAME"] == "db-connector"
    assert env["KAFKA_SASL_PASSWORD"] == values["KAFKA_DB_CONNECTOR_PASSWORD"]
    assert env["KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert env["INFLUXDB_USERNAME"] == "someone"
    assert "MQTT_PASSWORD" not in env
    assert credentials.environ_for("device", {})["MQTT_USERNAME"] == "device"


def test_no_file_no_identity(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(credentials.CREDENTIALS_FILE_ENV, str(tmp_path / "absent.env"))
    assert credentials.environ_for("db-connector", {"A": "1"}) == {"A": "1"}
    assert not credentials.is_secure()
