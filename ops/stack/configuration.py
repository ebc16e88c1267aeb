"""One configuration at a time: the settings a running stack's processes were started with.

supervisord starts every process with the environment of the `up` that started supervisord, so a setting
changed for a later `up` (a join-spec file, a port, a retention) would reach none of the running processes,
nor one started or restarted later, and the stack would go on with the old one without a word. `up` notes the
settings when it starts supervisord, and a later `up` with other settings refuses, naming them and what to run.

The settings are the environment variables the stack, its servers and the pipeline's stages read: their
prefixes and names below. A value that is empty counts as unset (make exports STACK_TLS, empty when not
given). Secrets are kept as digests only.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from pipeline_core import paths
from .processes import StackError

SETTING_PREFIXES = ("MQTT_", "KAFKA_", "INFLUXDB_", "SPARK_", "PYSPARK_", "CONNECTOR_", "STREAM_CONNECTOR_",
                    "DB_CONNECTOR_", "PROGRESS_", "HEALTH_", "PIPELINE_", "STACK_")
SETTING_NAMES = frozenset({"LOG_LEVEL", "DATA_TOPIC", "DLQ_TOPIC", "TLS_EXTRA_HOSTNAMES", "JAVA_HOME"})
# Which stack this is, not how it runs (the state dir is the stack; the cache only holds downloads). SECURITY=on
# makes the credentials file, which keeps the stack secure with or without it (docs/security.md).
NOT_SETTINGS = frozenset({"STACK_STATE_DIR", "STACK_CACHE_DIR", "SECURITY"})
# What only `status` reads.
NOT_SETTING_PREFIXES = ("STACK_DISK_WARN_",)
SECRET_MARKS = ("PASSWORD", "SECRET", "TOKEN")


def _record() -> Path:
    return paths.STATE_DIR / "supervisor" / "settings.json"


def is_setting(name: str) -> bool:
    return (name not in NOT_SETTINGS and not name.startswith(NOT_SETTING_PREFIXES)
            and (name in SETTING_NAMES or name.startswith(SETTING_PREFIXES)))


def _secret(name: str) -> bool:
    return any(mark in name for mark in SECRET_MARKS)


def current(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings in `environ` (default: this process's), secrets as digests."""
    environ = os.environ if environ is None else environ
    return {name: ("sha256:" + hashlib.sha256(value.encode()).hexdigest() if _secret(name) else value)
            for name, value in sorted(environ.items()) if value and is_setting(name)}


def note(settings: Mapping[str, str]) -> None:
    """Record the settings supervisord was started with (owner-only: paths and names, no secret)."""
    path = _record()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(json.dumps(dict(settings), indent=1, sort_keys=True) + "\n")


def noted() -> dict[str, str] | None:
    try:
        return json.loads(_record().read_text())
    except (FileNotFoundError, ValueError):
        return None


def take_noted(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Acting on the running stack (`status`, `logs`, `restart`, `down`, `clean`): its settings in `environ`
    (default: this process's) in place of the shell's, so that a shell without them (a cluster's
    `KAFKA_NODE<n>_HOST`, a port) still probes what runs; secrets, noted as digests only, are left as they are.
    Returns the settings the shell sets otherwise, one phrase each: `NAME='running' (this shell: 'other')`; one the
    shell leaves unset is taken without a word (the cluster's `up` sets KAFKA_BOOTSTRAP_SERVERS itself)."""
    environ = os.environ if environ is None else environ
    before = noted()
    if before is None:
        return []
    shell = {name: value for name, value in current(environ).items() if not _secret(name)}
    running = {name: value for name, value in before.items() if not _secret(name)}
    for name in shell.keys() - running.keys():
        del environ[name]
    environ.update(running)
    return [f"{name}={repr(running[name]) if name in running else 'unset'} (this shell: "
            f"{repr(shell[name]) if name in shell else 'unset'})"
            for name in sorted(shell) if running.get(name) != shell[name]]


def differences(before: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """What changed, one phrase per setting: `NAME='old' (now 'new')`, with secrets only said to have changed."""
    phrases = []
    for name in sorted(set(before) | set(now)):
        old, new = before.get(name), now.get(name)
        if old == new:
            continue
        if _secret(name):
            phrases.append(f"{name} ({'changed' if old and new else 'now set' if new else 'now unset'})")
        else:
            phrases.append(f"{name}={old!r} (now {repr(new) if new is not None else 'unset'})"
                           if old is not None else f"{name} unset (now {new!r})")
    return phrases


def check(settings: Mapping[str, str]) -> None:
    """Refuse an `up` whose settings differ from those the running supervisord was started with."""
    before = noted()
    if before is None:
        return
    changed = differences(before, settings)
    if changed:
        raise StackError("the running stack was started with other settings: " + "; ".join(changed) + ". Its "
                         "processes keep the settings they were started with: `make down`, then `make up` with the "
                         "new settings, applies them (the data is kept); `make up` with the settings it runs with "
                         "leaves it as it is")
