"""What the secure stack renders for Mosquitto and InfluxDB: hashes Mosquitto verifies, the ACLs of each
principal, and the InfluxQL that gives `writer` and `reader` exactly their privilege."""
from __future__ import annotations

import base64
import hashlib

from pipeline_core import credentials
from pipeline_core.mqtt import DEVICE_CLIENT_ID
from stack import influxdb_users, mqtt_security

VALUES = {key: f"secret-of-{key}" for key in credentials.password_keys()}


def test_password_hash_is_mosquittos_pbkdf2_sha512() -> None:
    # A line `mosquitto_passwd -U` wrote for the password "dummy" (Mosquitto 2.0.11).
    iterations, salt, expected = "101", "zvxJp5FQv3FmV5Lo", ("MP4FN8SCMJKxqDS+Jm2SLwFGhjS3kfTHxpG+u7juuL8dZTc4q0j2yWmjES7z"
                                                             "u6oVlvBWPBedSIIU6O56BC2r+Q==")
    assert mqtt_security.password_hash("dummy", base64.b64decode(salt), int(iterations)) == expected


def test_dynsec_config_holds_hashes_not_passwords_and_each_principals_acls() -> None:
    salts = iter(bytes([n]) * mqtt_security.SALT_BYTES for n in range(1, 10))
    config = mqtt_security.dynsec_config(VALUES, salt=lambda: next(salts))
    clients = {client["username"]: client for client in config["clients"]}
    assert set(clients) == {"device", "stream-connector"}
    for user, client in clients.items():
        password = VALUES[credentials.mqtt_password_key(user)]
        assert password not in repr(config)
        salt = base64.b64decode(client["salt"])
        assert len(salt) == mqtt_security.SALT_BYTES
        assert client["password"] == base64.b64encode(
            hashlib.pbkdf2_hmac("sha512", password.encode(), salt, client["iterations"])).decode()
        assert client["roles"] == [{"rolename": user}]
    assert clients["device"]["clientid"] == DEVICE_CLIENT_ID
    assert "clientid" not in clients["stream-connector"], "its shards use stream-connector-<shard>"
    assert clients["device"]["salt"] != clients["stream-connector"]["salt"]
    acls = {role["rolename"]: {(acl["acltype"], acl["topic"], acl["allow"]) for acl in role["acls"]}
            for role in config["roles"]}
    assert acls == {
        "device": {("publishClientSend", "machine/states/#", True)},
        "stream-connector": {("subscribePattern", "machine/states/#", True),
                             ("publishClientReceive", "machine/states/#", True)},
    }
    assert config["defaultACLAccess"] == {"publishClientSend": False, "publishClientReceive": False,
                                          "subscribe": False, "unsubscribe": True}


def test_insecure_stack_keeps_anonymous_mosquitto(tmp_path) -> None:
    assert mqtt_security.security_config({}, tmp_path) == "allow_anonymous true"
    assert not list(tmp_path.iterdir())


def test_secure_mosquitto_config_uses_the_plugin_and_a_private_file(tmp_path, monkeypatch) -> None:
    plugin = tmp_path / "mosquitto_dynamic_security.so"
    plugin.write_bytes(b"")
    monkeypatch.setenv(mqtt_security.DYNSEC_PLUGIN_ENV, str(plugin))
    lines = mqtt_security.security_config(VALUES, tmp_path / "mosquitto").splitlines()
    dynsec_file = tmp_path / "mosquitto" / "dynamic-security.json"
    assert lines == ["allow_anonymous false", f"plugin {plugin}", f"plugin_opt_config_file {dynsec_file}"]
    assert dynsec_file.stat().st_mode & 0o777 == 0o600


def test_influxql_quoting_cannot_be_escaped() -> None:
    assert influxdb_users.quote_string("it's a \\ test") == "'it\\'s a \\\\ test'"
    assert influxdb_users.quote_identifier('my "db"') == '"my \\"db\\""'


def test_user_statements_create_then_rotate_with_least_privilege() -> None:
    writer, reader = (VALUES[credentials.influxdb_password_key(user)] for user in ("writer", "reader"))
    assert influxdb_users.user_statements("machinedata", {"admin": True}, VALUES) == [
        f"CREATE USER \"writer\" WITH PASSWORD '{writer}'",
        'GRANT WRITE ON "machinedata" TO "writer"',
        f"CREATE USER \"reader\" WITH PASSWORD '{reader}'",
        'GRANT READ ON "machinedata" TO "reader"',
    ]
    # On a later start: the file's password set again (a rotation), an admin made by hand demoted.
    assert influxdb_users.user_statements("machinedata", {"admin": True, "writer": False, "reader": True},
                                          VALUES) == [
        f"SET PASSWORD FOR \"writer\" = '{writer}'",
        'GRANT WRITE ON "machinedata" TO "writer"',
        f"SET PASSWORD FOR \"reader\" = '{reader}'",
        'REVOKE ALL PRIVILEGES FROM "reader"',
        'GRANT READ ON "machinedata" TO "reader"',
    ]
