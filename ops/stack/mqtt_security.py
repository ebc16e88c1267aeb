"""Who may do what on Mosquitto when the stack runs secure (docs/security.md).

Mosquitto 2's dynamic security plugin (Debian ships `mosquitto_dynamic_security.so`) holds the users,
their hashed passwords and their ACLs in one JSON file that this module renders from the credentials
file on every start: rotating a password is editing the credentials file and restarting Mosquitto.

- `device` may publish under `machine/states/#` only; it may subscribe to nothing.
- `stream-connector` alone may subscribe to (and receive) `machine/states/#`.
- Mosquitto resumes or wipes a session by client id alone, whoever connects (eclipse-mosquitto
  issues #3551, #3553), and no option of 2.0 restricts a client id to a user. The plugin does bind a
  user to one exact client id: every user but the connector is bound (the device to
  `DEVICE_CLIENT_ID`), so only the connector can connect as `stream-connector` or
  `stream-connector-<shard>`, and no other user can take over or clean its queued session.
- Nobody gets the plugin's admin role: users and ACLs change only through this file.
"""
from __future__ import annotations

import base64
import glob
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline_core import credentials
from pipeline_core.mqtt import DEVICE_CLIENT_ID
from pipeline_core.settings import MACHINE_STATES_TOPIC

from .processes import StackError

# Mosquitto's own hash: PBKDF2-HMAC-SHA512, a 12-byte salt, a 64-byte hash (its `$7$` format).
SALT_BYTES = 12
# Mosquitto's own default is 101. The passwords are 32 random bytes, which no guessing reaches, so
# iterations matter only for a leaked file; every connect pays for them (1,000: about 1-6 ms here).
HASH_ITERATIONS = 1000
MACHINE_STATES_FILTER = f"{MACHINE_STATES_TOPIC}/#"  # `a/#` also matches `a` itself
DYNSEC_PLUGIN_ENV = "MOSQUITTO_DYNSEC_PLUGIN"
DYNSEC_PLUGIN_GLOBS = ("/usr/lib/*/mosquitto_dynamic_security.so", "/usr/lib/mosquitto_dynamic_security.so",
                       "/usr/local/lib/mosquitto_dynamic_security.so")


@dataclass(frozen=True)
class TlsFiles:
    """A TLS listener's certificate chain, private key and the CA that signed it (PEM files)."""

    cert_file: Path
    key_file: Path
    ca_file: Path


def password_hash(password: str, salt: bytes, iterations: int = HASH_ITERATIONS) -> str:
    """Mosquitto's PBKDF2-SHA512 hash of `password`, base64, as its plugin and password file store it."""
    return base64.b64encode(hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)).decode()


def _client(user: str, password: str, role: str, salt: bytes, clientid: str | None) -> dict[str, object]:
    client: dict[str, object] = {
        "username": user, "textName": f"the pipeline's {user}",
        "password": password_hash(password, salt), "salt": base64.b64encode(salt).decode(),
        "iterations": HASH_ITERATIONS, "roles": [{"rolename": role}]}
    if clientid is not None:
        client["clientid"] = clientid
    return client


def dynsec_config(values: Mapping[str, str], salt: Callable[[], bytes] = lambda: os.urandom(SALT_BYTES)
                  ) -> dict[str, object]:
    """The dynamic security plugin's file for the credentials `values` (see the module docstring)."""
    device, connector = "device", "stream-connector"

    def allow(acltype: str) -> dict[str, object]:
        return {"acltype": acltype, "topic": MACHINE_STATES_FILTER, "allow": True}

    return {
        "defaultACLAccess": {"publishClientSend": False, "publishClientReceive": False,
                             "subscribe": False, "unsubscribe": True},
        "roles": [
            {"rolename": device, "acls": [allow("publishClientSend")]},
            {"rolename": connector, "acls": [allow("subscribePattern"), allow("publishClientReceive")]},
        ],
        "clients": [
            _client(device, values[credentials.mqtt_password_key(device)], device, salt(), DEVICE_CLIENT_ID),
            _client(connector, values[credentials.mqtt_password_key(connector)], connector, salt(), None),
        ],
        "groups": [],
    }


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path`, readable by its owner only from the first byte."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.unlink(missing_ok=True)
    with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as file:
        file.write(text)
    os.replace(temporary, path)


def dynsec_plugin() -> str:
    """The plugin's shared object: $MOSQUITTO_DYNSEC_PLUGIN, else where Debian's mosquitto puts it."""
    configured = os.environ.get(DYNSEC_PLUGIN_ENV)
    found = [configured] if configured else [p for pattern in DYNSEC_PLUGIN_GLOBS for p in sorted(glob.glob(pattern))]
    if not found or not os.path.exists(found[0]):
        raise StackError("Mosquitto's dynamic security plugin (mosquitto_dynamic_security.so, in Debian's "
                         f"`mosquitto` package) is not installed; set {DYNSEC_PLUGIN_ENV} to its path")
    return found[0]


def security_config(values: Mapping[str, str], state_dir: Path) -> str:
    """The mosquitto.conf lines for `values`: anonymous clients allowed when there are no credentials
    (the insecure native stack), else only the plugin's users, with their ACLs."""
    if not values:
        return "allow_anonymous true"
    dynsec_file = state_dir / "dynamic-security.json"
    write_private(dynsec_file, json.dumps(dynsec_config(values), indent=2) + "\n")
    return "\n".join(["allow_anonymous false",
                      f"plugin {dynsec_plugin()}",
                      f"plugin_opt_config_file {dynsec_file}"])


def tls_listener_config(port: int, host: str, tls: TlsFiles | None) -> str:
    """A TLS listener for clients on other hosts (same users and ACLs), or nothing."""
    if tls is None:
        return ""
    for path in (tls.cert_file, tls.key_file, tls.ca_file):
        if not path.is_file():
            raise StackError(f"TLS for Mosquitto: {path} does not exist")
    return "\n".join([f"listener {port} {host}", f"certfile {tls.cert_file}", f"keyfile {tls.key_file}",
                      f"cafile {tls.ca_file}"])
