"""The pipeline's credentials: one file, readable by its owner only, generated at random on first use.

A secure native stack keeps them in `$STACK_STATE_DIR/credentials.env` (`make clean` deletes them with
the servers' state they belong to); Compose reads the same keys from `.env` at the repository root.
Each process runs as one principal and reads its identity from environment variables
(`KAFKA_SASL_USERNAME`, `MQTT_PASSWORD`, ...). `environ_for(principal)` fills in what the
environment does not give from the file, so secrets never appear on a command line and a tool run
by hand (`make data`, `make report`) finds them as the stages do.
"""
from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from . import paths

CREDENTIALS_FILE_ENV = "PIPELINE_CREDENTIALS_FILE"
# Values of .env.example that must never reach a server: `make up` refuses them.
PLACEHOLDER_MARK = "change-me"
# 32 random bytes, URL-safe: fits every server's password syntax (SCRAM, Mosquitto, InfluxQL strings).
PASSWORD_BYTES = 32

KAFKA_SASL_MECHANISM = "SCRAM-SHA-512"


@dataclass(frozen=True)
class Principal:
    """Who a process is on each server: its user there (None: it does not use that server)."""

    kafka_user: str | None = None
    mqtt_user: str | None = None
    influxdb_user: str | None = None


# Least privilege: each stage is its own Kafka principal with its own ACLs (docs/security.md).
# In the file when InfluxDB takes HTTPS (TOPOLOGY=hosts, where it is reached across hosts): its CA, which every
# InfluxDB client is given.
INFLUXDB_TLS_CA_KEY = "INFLUXDB_TLS_CA_FILE"

PRINCIPALS: dict[str, Principal] = {
    "admin": Principal(kafka_user="admin", influxdb_user="admin"),
    "monitor": Principal(kafka_user="monitor", influxdb_user="reader"),
    "device": Principal(mqtt_user="device"),
    "stream-connector": Principal(kafka_user="stream-connector", mqtt_user="stream-connector",
                                  influxdb_user="writer"),
    "lsb-joiner": Principal(kafka_user="lsb-joiner", influxdb_user="writer"),
    "spark-joiner": Principal(kafka_user="spark-joiner", influxdb_user="writer"),
    "db-connector": Principal(kafka_user="db-connector", influxdb_user="writer"),
    # The stack's watchdog writes its restart counts beside the stages' health points.
    "watchdog": Principal(influxdb_user="writer"),
    "reader": Principal(influxdb_user="reader"),
}


def _password_key(server: str, user: str) -> str:
    return f"{server}_{user.upper().replace('-', '_')}_PASSWORD"


def kafka_password_key(user: str) -> str:
    return _password_key("KAFKA", user)


def mqtt_password_key(user: str) -> str:
    return _password_key("MQTT", user)


def influxdb_password_key(user: str) -> str:
    return _password_key("INFLUXDB", user)


def password_keys() -> list[str]:
    """Every secret the pipeline needs, as keys of the credentials file."""
    keys = {kafka_password_key(p.kafka_user) for p in PRINCIPALS.values() if p.kafka_user}
    keys |= {mqtt_password_key(p.mqtt_user) for p in PRINCIPALS.values() if p.mqtt_user}
    keys |= {influxdb_password_key(p.influxdb_user) for p in PRINCIPALS.values() if p.influxdb_user}
    keys |= {"KAFKA_CONTROLLER_PASSWORD", "GRAFANA_ADMIN_PASSWORD"}
    return sorted(keys)


def credentials_file() -> Path:
    """Where this stack's credentials are: PIPELINE_CREDENTIALS_FILE, else in the stack's state dir."""
    return Path(os.environ.get(CREDENTIALS_FILE_ENV, paths.STATE_DIR / "credentials.env"))


def is_secure(path: Path | None = None) -> bool:
    """True when the stack runs with authentication: its credentials file exists."""
    return (path or credentials_file()).exists()


def parse(text: str) -> dict[str, str]:
    """KEY=VALUE lines; blank lines and `#` comments skipped; no quoting (values are URL-safe)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip()
    return values


def read_credentials(path: Path | None = None) -> dict[str, str]:
    """The file's keys and values; empty when the stack is not secure."""
    path = path or credentials_file()
    try:
        return parse(path.read_text())
    except FileNotFoundError:
        return {}


def placeholders(values: Mapping[str, str]) -> list[str]:
    """Keys whose value is a placeholder (or empty): these must be set before anything starts."""
    return sorted(key for key in password_keys() if PLACEHOLDER_MARK in values.get(key, PLACEHOLDER_MARK))


def ensure_credentials(path: Path | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The credentials, with every missing secret generated at random and written back (mode 0600).

    Existing values are kept: a server already holds them. `extra` adds settings that belong with them
    (say, KAFKA_SECURITY_PROTOCOL) where the file does not have them yet."""
    path = path or credentials_file()
    values = read_credentials(path)
    missing = [key for key in password_keys() if not values.get(key)]
    added = {key: value for key, value in (extra or {}).items() if key not in values}
    if missing or added or not path.exists():
        values.update({key: secrets.token_urlsafe(PASSWORD_BYTES) for key in missing})
        values.update(added)
        write_credentials(values, path)
    return values


def write_credentials(values: Mapping[str, str], path: Path | None = None) -> None:
    """Replace the file atomically, readable and writable by its owner only from its first byte."""
    path = path or credentials_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".credentials-")
    try:
        with os.fdopen(handle, "w") as file:  # mkstemp creates it 0600
            file.write("# The pipeline's credentials: readable by its owner only; docs/security.md.\n")
            file.writelines(f"{key}={value}\n" for key, value in sorted(values.items()))
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def environment(principal: str, values: Mapping[str, str]) -> dict[str, str]:
    """The environment variables that make a process `principal` on every server it uses."""
    who = PRINCIPALS[principal]
    env: dict[str, str] = {}
    if who.kafka_user:
        env.update({
            "KAFKA_SECURITY_PROTOCOL": values.get("KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT"),
            "KAFKA_SASL_MECHANISM": KAFKA_SASL_MECHANISM,
            "KAFKA_SASL_USERNAME": who.kafka_user,
            "KAFKA_SASL_PASSWORD": values[kafka_password_key(who.kafka_user)],
        })
        if values.get("KAFKA_SSL_CA_LOCATION"):
            env["KAFKA_SSL_CA_LOCATION"] = values["KAFKA_SSL_CA_LOCATION"]
    if who.mqtt_user:
        env.update({"MQTT_USERNAME": who.mqtt_user, "MQTT_PASSWORD": values[mqtt_password_key(who.mqtt_user)]})
        if values.get("MQTT_TLS_CA_FILE"):
            env["MQTT_TLS_CA_FILE"] = values["MQTT_TLS_CA_FILE"]
    if who.influxdb_user:
        env.update({"INFLUXDB_USERNAME": who.influxdb_user,
                    "INFLUXDB_PASSWORD": values[influxdb_password_key(who.influxdb_user)]})
        if values.get(INFLUXDB_TLS_CA_KEY):
            env[INFLUXDB_TLS_CA_KEY] = values[INFLUXDB_TLS_CA_KEY]
    return env


def environ_for(principal: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`environ` (default os.environ) with `principal`'s identity added from the credentials file
    wherever the environment does not set it: pass it to `load_settings(..., environ=...)`.
    Unchanged when the stack is not secure."""
    environ = os.environ if environ is None else environ
    values = read_credentials()
    if not values:
        return dict(environ)
    return {**environment(principal, values), **environ}
