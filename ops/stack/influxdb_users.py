"""InfluxDB's users when the stack runs secure (docs/security.md), made idempotently on every start.

With `auth-enabled = true` and no user yet, InfluxDB 1.x accepts exactly one statement without
credentials: `CREATE USER ... WITH ALL PRIVILEGES`. `admin` is made that way; then, as `admin`, the
pipeline's database, `writer` (WRITE on it: the DB connector and every stage's health points) and
`reader` (READ: Grafana, `make report`, `make status`). Their passwords are set from the credentials
file on every start, so rotating one is editing the file and restarting InfluxDB. The admin's own
authenticates all that: `python -m stack.influxdb_users` sets it from the file, asking for the old one.
"""
from __future__ import annotations

import getpass
import sys
from collections.abc import Mapping

from pipeline_core import credentials
from pipeline_core.influx import InfluxDBClient, InfluxDBClientError, influx_client
from pipeline_core.settings import InfluxSettings, load_settings

from .processes import StackError

ADMIN = "admin"
# The pipeline's users besides the admin, and their one privilege on the pipeline's database.
PRIVILEGES = {"writer": "WRITE", "reader": "READ"}
# InfluxDB's answer to anything but the first admin's creation while auth is on and no user exists.
NO_ADMIN_YET = "create admin user first"


def quote_identifier(name: str) -> str:
    """An InfluxQL identifier (user, database) in double quotes."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def quote_string(value: str) -> str:
    """An InfluxQL string literal (a password) in single quotes."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def user_statements(database: str, existing: Mapping[str, bool], values: Mapping[str, str]) -> list[str]:
    """The statements that give `writer` and `reader` exactly their privilege and the file's password.
    `existing`: the users InfluxDB has, each with whether it is an admin."""
    statements = []
    for user, privilege in PRIVILEGES.items():
        password = quote_string(values[credentials.influxdb_password_key(user)])
        if user in existing:
            statements.append(f"SET PASSWORD FOR {quote_identifier(user)} = {password}")
            if existing[user]:  # made by hand with ALL PRIVILEGES: least privilege again
                statements.append(f"REVOKE ALL PRIVILEGES FROM {quote_identifier(user)}")
        else:
            statements.append(f"CREATE USER {quote_identifier(user)} WITH PASSWORD {password}")
        statements.append(f"GRANT {privilege} ON {quote_identifier(database)} TO {quote_identifier(user)}")
    return statements


def admin_client(settings: InfluxSettings, values: Mapping[str, str]) -> InfluxDBClient:
    """A client with the right to create databases, users and retention policies: `admin` when the
    stack is secure (`values`: its credentials), else the anonymous one of the insecure stack."""
    if not values:
        return influx_client(settings)
    # The CA of InfluxDB's HTTPS (TOPOLOGY=hosts) is the credentials file's when the environment does not name one.
    ca_file = settings.influxdb_tls_ca_file or values.get(credentials.INFLUXDB_TLS_CA_KEY)
    return InfluxDBClient(host=settings.influxdb_host, port=settings.influxdb_port, username=ADMIN,
                          password=values[credentials.influxdb_password_key(ADMIN)],
                          database=settings.influxdb_database, timeout=30,
                          **({"ssl": True, "verify_ssl": str(ca_file)} if ca_file else {}))


def _ensure_first_admin(client: InfluxDBClient, password: str) -> None:
    try:
        client.query("SHOW USERS")
        return
    except InfluxDBClientError as error:
        if error.code == 401:
            raise StackError("InfluxDB refuses the admin password of the credentials file "
                             f"({credentials.credentials_file()}): set it back, or run "
                             "`python -m stack.influxdb_users` to make InfluxDB take it") from None
        if NO_ADMIN_YET not in str(error.content):
            raise
    client.query(f"CREATE USER {quote_identifier(ADMIN)} WITH PASSWORD {quote_string(password)} "
                 "WITH ALL PRIVILEGES", method="POST")


def ensure_database_and_users(settings: InfluxSettings, values: Mapping[str, str]) -> None:
    """The pipeline's database, and when the stack is secure (`values`: its credentials) the admin,
    writer and reader users with their privileges and the file's passwords."""
    client = admin_client(settings, values)
    if values:
        _ensure_first_admin(client, values[credentials.influxdb_password_key(ADMIN)])
    client.create_database(settings.influxdb_database)
    if not values:
        return
    existing = {row["user"]: bool(row["admin"]) for row in client.query("SHOW USERS").get_points()}
    for statement in user_statements(settings.influxdb_database, existing, values):
        client.query(statement, method="POST")


def main() -> int:
    """Give InfluxDB's admin the password of the credentials file, authenticating with the old one
    (asked for on the terminal, never a command-line argument)."""
    values = credentials.read_credentials()
    if not values:
        print(f"no credentials file at {credentials.credentials_file()}: the stack is not secure", file=sys.stderr)
        return 1
    settings = load_settings(InfluxSettings, [])
    old = dict(values)
    old[credentials.influxdb_password_key(ADMIN)] = getpass.getpass("InfluxDB admin's current password: ")
    new_password = quote_string(values[credentials.influxdb_password_key(ADMIN)])
    try:
        admin_client(settings, old).query(f"SET PASSWORD FOR {quote_identifier(ADMIN)} = {new_password}",
                                          method="POST")
    except InfluxDBClientError as error:
        print(f"InfluxDB refused: {str(error.content)[:300]}", file=sys.stderr)
        return 1
    print("InfluxDB's admin now has the password of the credentials file")
    return 0


if __name__ == "__main__":
    sys.exit(main())
